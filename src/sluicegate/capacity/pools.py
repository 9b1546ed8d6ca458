"""A pool is one shared capacity (a deployment, or a provider quota spanning several).

Every upstream attempt takes a `PoolPermit` from each pool of the deployment it will
hit: a concurrency slot, one unit of the request rate and a token reservation. The
permit is released exactly once, when the attempt has really ended, and the token
reservation is then settled against the usage the provider reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluicegate.core.errors import GatewayError
from sluicegate.core.limits import LimitStore
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import PoolSpec


@dataclass(slots=True)
class PoolCounters:
    """This process's view, read by the metrics collector at scrape time."""

    active: int = 0
    tokens_reserved: int = 0
    tokens_used: int = 0
    tokens_unsettled: int = 0


class Pool:
    def __init__(self, limits: PoolSpec, store: LimitStore) -> None:
        self.limits = limits
        self.counters = PoolCounters()
        self._store = store
        prefix = f"pool:{limits.name}:"
        self._slots_key = prefix + "slots"
        self._requests_key = prefix + "requests"
        self._tokens_key = prefix + "tokens"
        self._cool_key = prefix + "cool"
        self._listeners: list[Callable[[], None]] = []

    @property
    def name(self) -> str:
        return self.limits.name

    async def acquire(self, tokens: int) -> PoolPermit:
        """Take a permit for one attempt reserving `tokens`, or raise a refusal at once.

        Waiting is the scheduler's job (its lane queues), never the pool's.
        """
        cooling = await self._store.cooldown_left(self._cool_key)
        if cooling > 0:
            raise Refusal.POOL_COOLING.error(f"pool {self.name} is cooling down", cooling)
        if not await self._store.acquire(self._slots_key, self.limits.max_concurrency):
            raise Refusal.CAPACITY.error(f"pool {self.name} is at its concurrency limit")
        self.counters.active += 1
        permit = PoolPermit(self, 0)
        try:
            await self._charge(permit, tokens)
        except BaseException:
            await permit.release(None)
            raise
        return permit

    async def cool(self, duration_s: float) -> None:
        await self._store.cool(self._cool_key, duration_s)

    async def available_tokens(self) -> float:
        rate = self.limits.tokens
        return float("inf") if rate is None else await self._store.available(self._tokens_key, rate)

    def on_release(self, listener: Callable[[], None]) -> None:
        """Called after every release: whoever waits for this pool may try again."""
        self._listeners.append(listener)

    async def _charge(self, permit: PoolPermit, tokens: int) -> None:
        requests, token_rate = self.limits.requests, self.limits.tokens
        if requests is not None:
            decision = await self._store.consume(self._requests_key, requests, 1)
            if not decision.allowed:
                raise _rate_refusal(Refusal.POOL_RATE, self.name, decision.retry_after_s)
        if token_rate is not None:
            decision = await self._store.consume(self._tokens_key, token_rate, tokens)
            if not decision.allowed:
                if requests is not None:
                    await self._store.refund(self._requests_key, requests, 1)
                raise _rate_refusal(Refusal.POOL_TOKENS, self.name, decision.retry_after_s)
        permit.reserved = tokens
        self.counters.tokens_reserved += tokens

    async def _release(self, permit: PoolPermit, used: int | None) -> None:
        try:
            await self._settle(permit.reserved, used)
        finally:
            await self._store.release(self._slots_key)
            self.counters.active -= 1
            for listener in self._listeners:
                listener()

    async def _settle(self, reserved: int, used: int | None) -> None:
        """Give back what a finished attempt did not use; an unknown usage keeps it all."""
        if used is None:
            self.counters.tokens_unsettled += reserved
            return
        self.counters.tokens_used += used
        if self.limits.tokens is not None and used != reserved:
            await self._store.refund(self._tokens_key, self.limits.tokens, reserved - used)


class PoolPermit:
    """Held for the whole attempt; `release` is idempotent so no path can free it twice."""

    __slots__ = ("_pool", "_released", "reserved")

    def __init__(self, pool: Pool, reserved: int) -> None:
        self._pool = pool
        self.reserved = reserved
        self._released = False

    async def release(self, used_tokens: int | None) -> None:
        if self._released:
            return
        self._released = True
        await self._pool._release(self, used_tokens)


def _rate_refusal(reason: Refusal, pool: str, retry_after_s: float) -> GatewayError:
    unit = "request" if reason is Refusal.POOL_RATE else "token"
    return reason.error(f"pool {pool} is over its {unit} rate", retry_after_s)
