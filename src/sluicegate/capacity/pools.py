"""A pool is one shared capacity (a deployment, or a provider quota spanning several).

Every upstream attempt takes, in one all-or-nothing decision, a concurrency slot, one
unit of the request rate and a token reservation from each pool of the deployment it
will hit: a refusal from any pool leaves every other untouched, and a cancellation
cannot fall between two pools. The `PoolPermit` is released exactly once, when the
attempt has really ended, and the token reservations are then settled against the
usage the provider reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sluicegate.core import keys
from sluicegate.core.clock import Wakeup
from sluicegate.core.errors import GatewayError
from sluicegate.core.leases import Leases, store_unavailable, unheard
from sluicegate.core.limits import (
    Ask,
    Charge,
    Lease,
    Part,
    Prefill,
    PrefillEnd,
    PrefillState,
    Refused,
    Slot,
    StoreUnavailable,
    priced,
    unspent,
)
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import PoolSpec


@dataclass(slots=True)
class PoolCounters:
    """This process's counts; `Pool.view()` hands out a copy."""

    active: int = 0
    tokens_reserved: int = 0
    tokens_used: int = 0
    tokens_unsettled: int = 0


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    active: int
    limit: int
    tokens_reserved: int
    tokens_used: int
    tokens_unsettled: int
    cooldown_s: float
    """How long the cooldown this process last set still runs (0 when none does)."""


class Pool:
    def __init__(self, limits: PoolSpec, leases: Leases) -> None:
        self.limits = limits
        self.counters = PoolCounters()
        self.leases = leases
        name = limits.name
        self.slot = Slot(keys.pool_slots(name), limits.max_concurrency)
        self.cooldown_key = keys.pool_cooldown(name)
        self._requests_key = keys.pool_requests(name)
        self._tokens_key = keys.pool_tokens(name)
        self._listeners: list[Callable[[], None]] = []
        self._look_again = Wakeup(leases.clock, self.freed)
        self._cool_until_s = float("-inf")

    @property
    def name(self) -> str:
        return self.limits.name

    def view(self) -> PoolView:
        c = self.counters
        return PoolView(
            self.name,
            c.active,
            self.limits.max_concurrency,
            c.tokens_reserved,
            c.tokens_used,
            c.tokens_unsettled,
            max(0.0, self._cool_until_s - self.leases.clock.now()),
        )

    def charges(self, tokens: int) -> tuple[Charge, ...]:
        """One request and `tokens` tokens, for the rates this pool has."""
        found: list[Charge] = []
        if self.limits.requests is not None:
            found.append(Charge(self._requests_key, self.limits.requests, 1))
        if self.limits.tokens is not None:
            found.append(Charge(self._tokens_key, self.limits.tokens, tokens))
        return tuple(found)

    async def cool(self, duration_s: float) -> None:
        until = self.leases.clock.now() + duration_s
        self._cool_until_s = max(self._cool_until_s, until)
        try:
            await self.leases.store.cool(self.cooldown_key, duration_s)
        except StoreUnavailable:
            raise store_unavailable() from None

    async def available_tokens(self) -> float:
        rate = self.limits.tokens
        if rate is None:
            return float("inf")
        return await self.leases.store.available(self._tokens_key, rate)

    def on_release(self, listener: Callable[[], None]) -> None:
        """Called after every release: whoever waits for this pool may try again."""
        self._listeners.append(listener)

    def freed(self) -> None:
        """A slot of this pool came free, here or in another process sharing the store:
        whoever waits for it may try again."""
        for listener in self._listeners:
            listener()

    def look_again(self, in_s: float) -> None:
        """A refusal may lift with time alone, `in_s` from now: a slot set aside for
        another replica first in the shared line lapses unclaimed (it is told if it is
        claimed), a prompt holding the prefill budget passes its due time without a
        first token. Whoever waits looks again then."""
        self._look_again.in_s(in_s)

    def _taken(self, tokens: int) -> None:
        self.counters.active += 1
        self.counters.tokens_reserved += tokens

    def _settled(self, reserved: int, used: int | None) -> None:
        self.counters.active -= 1
        if used is None:
            self.counters.tokens_unsettled += reserved
        else:
            self.counters.tokens_used += used
        self.freed()


class PoolGroup:
    """The pools of one deployment, asked as one decision; what does not depend on the
    request (cooldowns, slots, request counts) is built once."""

    def __init__(self, pools: Sequence[Pool]) -> None:
        self.pools = tuple(pools)
        self.leases = self.pools[0].leases
        self._owners = [(pool, charge) for pool in self.pools for charge in pool.charges(0)]
        self.tokens = tuple(
            i for i, (pool, charge) in enumerate(self._owners) if charge.key == pool._tokens_key
        )
        """Which charges are token charges: their cost is each attempt's reservation."""
        self._cooldowns = tuple(pool.cooldown_key for pool in self.pools)
        self._slots = tuple(pool.slot for pool in self.pools)
        self._spared: dict[int, tuple[Slot, ...]] = {0: self._slots}
        self._charges = tuple(charge for _, charge in self._owners)

    async def acquire(
        self,
        tokens: int,
        backend: Slot | None = None,
        spare: int = 0,
        queued: bool = False,
        prefill: Prefill | None = None,
    ) -> PoolPermit | GatewayError:
        """A permit from every pool reserving `tokens`, or at once the refusal to answer
        with (returned, never raised: the dispatcher weighs it against others, and a
        raised one would carry frames it keeps alive). `backend`: the fleet's bound on
        what may be in flight to the deployment's backend, decided with the pools.
        `spare`: slots of each pool this attempt must leave free (the dispatcher's
        reserve for requests within their share). `queued`: the attempt waits in a queue
        for these pools, so a refusal puts its replica in the pools' line (`Ask`); one
        about to try another deployment does not, or it would be set aside slots it no
        longer wants. `prefill`: the prompt counted in the deployment's prefill budget
        from this decision to its first token (`PoolPermit.first_token`) or its release.

        Waiting is the scheduler's job (its lane queues), never the pools'.
        """
        charges = priced(self._charges, self.tokens, tokens)
        slots = self._spared.get(spare)
        if slots is None:
            slots = tuple(Slot(slot.key, slot.limit - spare) for slot in self._slots)
            self._spared[spare] = slots
        if backend is not None:
            slots = (*slots, backend)
        try:
            decision = await self.leases.take(Ask(self._cooldowns, slots, charges, queued, prefill))
        except StoreUnavailable:
            return store_unavailable()
        if isinstance(decision, Refused):
            lapse_s = decision.retry_after_s
            if lapse_s is not None and decision.part is Part.SLOT:
                self.pools[decision.index].look_again(lapse_s)
            elif lapse_s is not None and decision.part is Part.PREFILL:
                self.pools[0].look_again(lapse_s)
            return _refusal(decision, self.pools, self._owners)
        for pool in self.pools:
            pool._taken(tokens)
        return PoolPermit(self, decision, tokens, charges, None if prefill is None else prefill.key)

    def _prefill_ended(self, end: PrefillEnd, answered: Callable[[PrefillState], None]) -> None:
        """Once the store has ended `end`, whoever waits for the deployment looks again."""

        def ended(state: PrefillState) -> None:
            for pool in self.pools:
                pool.freed()
            answered(state)

        self.leases.prefilled(end, ended)


class PoolPermit:
    """Held for the whole attempt; `release` is idempotent so no path can free it twice."""

    __slots__ = ("_charges", "_group", "_lease", "_released", "prefilling", "reserved")

    def __init__(
        self,
        group: PoolGroup,
        lease: Lease,
        reserved: int,
        charges: tuple[Charge, ...],
        prefilling: str | None,
    ) -> None:
        self._group = group
        self._lease = lease
        self.reserved = reserved
        self._charges = charges
        self._released = False
        self.prefilling = prefilling
        """The prefill budget counting this attempt's prompt until its first token."""

    def first_token(self, answered: Callable[[PrefillState], None], learn: bool = True) -> None:
        """The prompt got its first token: it stops counting in its prefill budget, which
        learns from it unless told not to (a prompt whose prefill the engine may have
        cached in part); whoever waits for the deployment may try again, and `answered`
        hears the budget's state, once the store has it (this cannot wait for it)."""
        budget = self.prefilling
        if budget is not None:
            self.prefilling = None
            self._group._prefill_ended(PrefillEnd(budget, self._lease.id, learn), answered)

    async def release(self, used_tokens: int | None) -> None:
        """Free the slots and give back what a finished attempt did not use, in one give-back;
        an unknown usage keeps the whole reservation."""
        if self._released:
            return
        self._released = True
        group = self._group
        budget = self.prefilling
        if budget is not None:
            self.prefilling = None
            group._prefill_ended(PrefillEnd(budget, self._lease.id, False), unheard)
        refunds = unspent(self._charges, group.tokens, self.reserved, used_tokens)
        try:
            await group.leases.give_back(self._lease, refunds)
        finally:
            for pool in group.pools:
                pool._settled(self.reserved, used_tokens)


def _refusal(
    refused: Refused, pools: Sequence[Pool], owners: list[tuple[Pool, Charge]]
) -> GatewayError:
    if refused.part is Part.PREFILL:
        return Refusal.BACKEND_BUSY.error(
            "the deployment is prefilling as many prompt tokens as the promise allows"
        )
    if refused.part is Part.COOLDOWN:
        name = pools[refused.index].name
        return Refusal.POOL_COOLING.error(f"pool {name} is cooling down", refused.retry_after_s)
    if refused.part is Part.SLOT and refused.index == len(pools):
        return Refusal.BACKEND_BUSY.error("the backend's queue is at the lane's bound")
    if refused.part is Part.SLOT:
        name = pools[refused.index].name
        return Refusal.POOL_CONCURRENCY.error(f"pool {name} is at its concurrency limit")
    pool, charge = owners[refused.index]
    if charge.key == pool._tokens_key:
        return Refusal.POOL_TOKENS.error(
            f"pool {pool.name} is over its token rate", refused.retry_after_s
        )
    return Refusal.POOL_RATE.error(
        f"pool {pool.name} is over its request rate", refused.retry_after_s
    )
