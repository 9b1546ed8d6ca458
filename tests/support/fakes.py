"""Scripted fakes of the project's own protocols (never of a third-party driver)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sluicegate.core.clock import sleep_until
from sluicegate.core.errors import GatewayError
from sluicegate.core.limits import (
    Ask,
    GiveBack,
    Lease,
    LimitStore,
    PrefillEnd,
    PrefillState,
    Rate,
    Refused,
    Slot,
    StoreTimeout,
    StoreUnavailable,
)
from sluicegate.core.types import Deployment, Endpoint
from sluicegate.providers.base import interrupted, timed_out
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock

OK_BODY = b'{"choices": [{"message": {"content": "hi"}}]}'


class FakeResponse:
    def __init__(
        self, used_tokens: int | None, chunks: list[bytes], broken: GatewayError | None = None
    ) -> None:
        self._reported = used_tokens
        self._chunks = chunks
        self._broken = broken
        self.used_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None

    async def read(self) -> bytes:
        if self._broken is not None:
            raise self._broken
        self.used_tokens = self._reported
        self.completion_tokens = None if self._reported is None else 2
        return OK_BODY

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk
        self.used_tokens = self._reported


class ScriptedProvider:
    """A `Provider` that answers as told: `answer` (with `used_tokens`), `fail` (a
    failover error), `hang` (until cancelled), `raise` (the `error` set on it),
    `break` (starts answering, then the body fails with `interrupted`) or
    `slow` (answers after `delay_s` on `clock`, or times out as a real transport
    does once its `budget_s` is spent). Records every body it was sent and how many
    calls are still open."""

    def __init__(self, deployment: Deployment, mode: str = "answer", used_tokens: int = 7):
        self.deployment = deployment
        self.mode = mode
        self.used_tokens = used_tokens
        self.bodies: list[dict[str, Any]] = []
        self.open_calls = 0
        self.cancelled = 0
        self.error: GatewayError | None = None
        self.clock: FakeClock | None = None
        self.delay_s = 0.0

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @asynccontextmanager
    async def open(
        self, endpoint: Endpoint, payload: dict[str, Any], budget_s: float
    ) -> AsyncIterator[FakeResponse]:
        self.bodies.append(payload)
        self.open_calls += 1
        try:
            if self.mode == "fail":
                raise timed_out(self.deployment.name)
            if self.mode == "hang":
                await asyncio.Event().wait()
            if self.mode == "raise":
                assert self.error is not None
                raise self.error
            if self.mode == "slow":
                assert self.clock is not None
                await sleep_until(self.clock, self.clock.now() + min(self.delay_s, budget_s))
                if budget_s < self.delay_s:
                    raise timed_out(self.deployment.name)
            broken = interrupted(self.deployment.name) if self.mode == "break" else None
            chunks = [b"data: {}\n\n", b"data: [DONE]\n\n"]
            yield FakeResponse(self.used_tokens, chunks, broken)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.open_calls -= 1


class YieldingStore:
    """A `LimitStore` that gives the loop a turn before every call, as any networked store
    does: check-then-act code that a store answering at once hides breaks on it. A
    decision yields once per key it looks at; `cancelled[key]` counts cancellations that
    arrived there, `takes` the decisions asked (each a round trip to a networked store)."""

    def __init__(self, inner: LimitStore) -> None:
        self.inner = inner
        self.cancelled: dict[str, int] = {}
        self.takes = 0

    async def _turn(self, key: str) -> None:
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled[key] = self.cancelled.get(key, 0) + 1
            raise

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        self.takes += 1
        for key in (*ask.cooldowns, *(slot.key for slot in ask.slots)):
            await self._turn(key)
        return await self.inner.take(ask, lease, ttl_s)

    async def renew(self, leases: Sequence[Lease], ttl_s: float) -> None:
        await self._turn("renew")
        await self.inner.renew(leases, ttl_s)

    async def give_back(self, backs: Sequence[GiveBack]) -> None:
        await self._turn("give_back")
        await self.inner.give_back(backs)

    async def prefilled(self, ends: Sequence[PrefillEnd]) -> dict[str, PrefillState]:
        await self._turn("prefilled")
        return await self.inner.prefilled(ends)

    async def cool(self, key: str, duration_s: float) -> None:
        await self._turn(key)
        await self.inner.cool(key, duration_s)

    async def in_use(self, key: str) -> int:
        await self._turn(key)
        return await self.inner.in_use(key)

    async def available(self, key: str, rate: Rate) -> float:
        await self._turn(key)
        return await self.inner.available(key, rate)


class UnreachableStore:
    """A `LimitStore` whose every call fails as an unreachable server's would."""

    async def _fail(self) -> Any:
        raise StoreUnavailable("connection refused")

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        return await self._fail()

    async def renew(self, leases: Sequence[Lease], ttl_s: float) -> None:
        await self._fail()

    async def give_back(self, backs: Sequence[GiveBack]) -> None:
        await self._fail()

    async def prefilled(self, ends: Sequence[PrefillEnd]) -> dict[str, PrefillState]:
        return await self._fail()

    async def cool(self, key: str, duration_s: float) -> None:
        await self._fail()

    async def in_use(self, key: str) -> int:
        return await self._fail()

    async def available(self, key: str, rate: Rate) -> float:
        return await self._fail()


class SharedFake:
    """A `SharedStore` (a limit store replicas share, with adoption and heartbeats) held
    in memory, that can be taken down (refusing connections) or made slow (answering too
    late), and brought back; `calls` counts every call that reached it. Each call takes
    `latency_s` on the clock (none by default), as a round trip would."""

    def __init__(self, clock: FakeClock) -> None:
        self.inner = MemoryLimitStore(clock)
        self.down = False
        self.slow = False
        self.adopting_fails = False
        self.hold: asyncio.Event | None = None
        """When set, every call that reached the store waits for it before it acts."""
        self.calls = 0
        self.latency_s = 0.0
        self._clock = clock
        self._replicas: dict[str, float] = {}

    async def _reached(self) -> None:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("connection refused")
        if self.latency_s:
            await sleep_until(self._clock, self._clock.now() + self.latency_s)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.inner, name)

        async def call(*args: Any) -> Any:
            await self._reached()
            if self.hold is not None:
                await self.hold.wait()
            result = await method(*args)
            if self.slow:
                raise StoreTimeout("applied, but the answer came too late")
            return result

        return call

    async def adopt(self, leases: Sequence[Lease], ttl_s: float) -> None:
        await self._reached()
        if self.adopting_fails:
            raise StoreUnavailable("connection reset while adopting")
        for lease in leases:
            unbounded = Ask(slots=tuple(Slot(key, sys.maxsize) for key in lease.keys))
            await self.inner.take(unbounded, lease, ttl_s)

    async def close(self) -> None:
        return None

    async def beat(self, replica: str, ttl_s: float) -> int:
        await self._reached()
        now = self._clock.now()
        self._replicas[replica] = now + ttl_s
        return sum(1 for until in self._replicas.values() if until > now)
