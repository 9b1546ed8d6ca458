"""A shared limit store with a declared degraded mode: never a hang, never a silent change.

While the shared store (Redis) answers, every decision is made there. Its circuit opens
at once when it refuses connections, and after `STRIKES` calls in a row that did not
answer in time (one slow answer on a busy machine is not an outage: that call alone is
refused as unavailable). From then on no request waits on the shared store: each
decision is made in this process's memory under the policy configured for its kind of
limit:

- `local_share`: each replica enforces its share, limit / live replicas (slots rounded
  up), against everything it has in flight, including what the shared store granted
  it before the outage; the live count is learned from the replicas' heartbeats in the
  shared store (or the configured expectation when it was never reached);
- `fail_closed`: refused as unavailable (503);
- `fail_open`: not enforced at all.

A probe (the replica heartbeat) retries the shared store every `probe_s`; once it
answers, the leases released meanwhile are released there, the leases still held are
adopted there (so the fleet counts them), and decisions go back to the shared store, at
that probe however busy the replica is: the fleet converges without a restart.

Over-admission is bounded. During an outage, by the live count being stale: one that
died still counts (the fleet under-admits); one that joined does not (each old replica
admits up to ceil(limit / old count)). Right after it, by what each rate granted
locally, which the shared rate state does not know of: at most one burst per rate.
When only some replicas lose the store (a partition), the ones still on it do not see
the others' local grants: at most the degraded replicas' shares over the limit, for
as long as they are cut off. A deployment's prefill budget, which no limit configures,
is each degraded replica's own, learnt afresh from its own first tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sluicegate.core.clock import Clock, sleep_until, timeout_at
from sluicegate.core.limits import (
    NO_SLOTS,
    Ask,
    Charge,
    GiveBack,
    Lease,
    LimitStore,
    Part,
    PrefillEnd,
    PrefillState,
    Rate,
    Refund,
    Refused,
    Slot,
    StoreTimeout,
    StoreUnavailable,
)
from sluicegate.core.types import DegradedPolicy, WhenDown
from sluicegate.stores.memory import MemoryLimitStore

log = logging.getLogger("sluicegate")

STRIKES = 3
"""Calls in a row without an answer in time that open the circuit."""
MAX_ORPHANS = 100_000
"""Leases to release in the shared store once it answers again; past this they lapse."""
ORPHANS_AT_ONCE = 256


class SharedStore(LimitStore, Protocol):
    async def adopt(self, leases: Sequence[Lease], ttl_s: float) -> None: ...

    async def beat(self, replica: str, ttl_s: float) -> int: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class StoreView:
    degraded: bool
    live: int
    """Live replicas, as last learned."""
    transitions: int
    timeouts: int
    """Calls the shared store did not answer in time."""


class FailoverStore:
    def __init__(
        self,
        shared: SharedStore,
        clock: Clock,
        policy: DegradedPolicy,
        ttl_s: float,
        *,
        degraded: bool = False,
    ) -> None:
        self._shared = shared
        self._local = MemoryLimitStore(clock)
        self._clock = clock
        self._policy = policy
        self._ttl_s = ttl_s
        self.replica = uuid.uuid4().hex[:12]
        self.live = policy.expected_replicas
        self.degraded = degraded
        self.transitions = 0
        self._timeouts = 0
        self._strikes = 0
        self._shared_leases: dict[str, Lease] = {}
        """Leases the shared store granted this replica, still held."""
        self._local_leases: dict[str, Lease] = {}
        """Leases decided here (or carried over from the shared store) while degraded."""
        self._orphans: dict[str, Lease] = {}
        """Leases the shared store may hold that nobody here holds any more."""
        self._counted_here: set[str] = set()
        """Leases whose prompt the local store counts in a prefill budget: their ends go
        there, wherever their lease is held by then."""
        self._untold: dict[str, PrefillEnd] = {}
        """Ends of prompts the shared store counts that it could not be told of: told
        (as ends without a first token) once it answers again, or those prompts would
        stay counted there for as long as their leases are renewed."""
        self._listeners: list[Callable[[bool], None]] = []
        self._degraded = asyncio.Event()
        """Set when the store degrades: the heartbeat then probes every `probe_s`."""
        self._handing_over: asyncio.Event | None = None
        """Set while the last leases decided here are handed over: local decisions wait
        for it (at most one call of the shared store, which is bounded)."""

    def view(self) -> StoreView:
        return StoreView(self.degraded, self.live, self.transitions, self._timeouts)

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """Called with the new state whenever the store degrades or recovers."""
        self._listeners.append(listener)

    async def close(self) -> None:
        await self._shared.close()

    async def _failed(self, why: StoreUnavailable) -> bool:
        """Count a failed call; True when decisions are now local."""
        if isinstance(why, StoreTimeout):
            self._timeouts += 1
            self._strikes += 1
            if self._strikes < STRIKES and not self.degraded:
                return False
        await self._degrade(why)
        return True

    async def _degrade(self, why: StoreUnavailable) -> None:
        """Decide locally from now on, counting what the shared store granted us."""
        if self.degraded:
            return
        self.degraded = True
        self._degraded.set()
        self.transitions += 1
        held, self._shared_leases = self._shared_leases, {}
        for lease in held.values():
            await self._hold_here(lease)
        policy = self._policy
        log.warning(
            "the limit store is unreachable (%s): degraded, concurrency %s, rates %s, "
            "as one of %d replicas; retrying every %gs",
            why, policy.concurrency, policy.rates, self.live, policy.probe_s,
        )  # fmt: skip
        for listener in self._listeners:
            listener(True)

    async def _recover(self) -> None:
        """Hand every lease held here to the shared store and decide there again, under
        any load: no moment without a lease taken or freed is needed. First, with local
        decisions going on, release there what ended meanwhile and adopt what is held;
        then, with new local decisions held back (`_handing_over`), adopt the few leases
        taken during the first step and switch, with no await between that adoption
        and the switch. Until the switch every lease stays counted here: a call that
        fails leaves the store degraded and its state whole (adopting again is
        harmless). A lease freed during the hand-over is released there right after
        it (counted meanwhile: the fleet under-admits, briefly)."""
        await self._release_orphans(list(self._orphans.values()))
        await self._tell_ends()
        adopted = dict(self._local_leases)
        if adopted:
            await self._shared.adopt(list(adopted.values()), self._ttl_s)
        handing_over = self._handing_over = asyncio.Event()
        try:
            late = [lease for i, lease in self._local_leases.items() if i not in adopted]
            if late:
                await self._shared.adopt(late, self._ttl_s)
            await self._switch_back()
        finally:
            self._handing_over = None
            handing_over.set()
        await self._release_orphans(list(self._orphans.values()))

    async def _switch_back(self) -> None:
        held, self._local_leases = self._local_leases, {}
        await self._local.give_back([GiveBack(lease) for lease in held.values()])
        self._shared_leases.update(held)
        self.degraded = False
        self._strikes = 0
        self.transitions += 1
        log.warning(
            "the limit store is reachable again: shared limits restored (%d leases handed over)",
            len(held),
        )
        for listener in self._listeners:
            listener(False)

    async def _release_orphans(self, orphans: Sequence[Lease]) -> None:
        """In batches, each one call of the shared store, not a round trip per lease."""
        for start in range(0, len(orphans), ORPHANS_AT_ONCE):
            batch = orphans[start : start + ORPHANS_AT_ONCE]
            await self._shared.give_back([GiveBack(lease) for lease in batch])
            for lease in batch:
                self._orphans.pop(lease.id, None)

    async def _hold_here(self, lease: Lease) -> None:
        """Count here a lease the shared store granted: at the switch to local decisions,
        or when its grant arrives after that switch."""
        await self._local.take(_unbounded(lease), lease, self._ttl_s)
        self._local_leases[lease.id] = lease

    def _orphan(self, lease: Lease) -> None:
        if lease.keys and len(self._orphans) < MAX_ORPHANS:
            self._orphans[lease.id] = lease

    async def run(self) -> None:
        """The replica heartbeat, which is also the probe: every third of the lease TTL
        while healthy (the live count), every `probe_s` while degraded, counted from the
        moment it degraded (a request may find the store gone between two beats)."""
        clock = self._clock
        while True:
            await self.run_once()
            if not self.degraded:
                self._degraded.clear()
                with contextlib.suppress(TimeoutError):
                    async with timeout_at(clock, clock.now() + self._ttl_s / 3):
                        await self._degraded.wait()
            if self.degraded:
                await sleep_until(clock, clock.now() + self._policy.probe_s)

    async def run_once(self) -> None:
        try:
            self.live = max(1, await self._shared.beat(self.replica, self._ttl_s))
            self._strikes = 0
            if self.degraded:
                await self._recover()
            elif self._orphans or self._untold:
                await self._release_orphans(list(self._orphans.values()))
                await self._tell_ends()
        except StoreUnavailable as why:
            await self._failed(why)

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        if self._handing_over is not None:
            await self._handing_over.wait()
        if not self.degraded:
            try:
                refused = await self._shared.take(ask, lease, ttl_s)
            except StoreUnavailable as why:
                self._orphan(lease)
                if not await self._failed(why):
                    raise
            else:
                self._strikes = 0
                if refused is None and lease.keys:
                    if not self.degraded:
                        self._shared_leases[lease.id] = lease
                    else:
                        await self._hold_here(lease)
                return refused
        local, slots, charges = self._locally(ask)
        keys = tuple([slot.key for slot in local.slots])
        refused = await self._local.take(local, Lease(lease.id, keys), ttl_s)
        if refused is not None:
            return Refused(refused.part, _original(refused, slots, charges), refused.retry_after_s)
        if lease.keys:
            self._local_leases[lease.id] = lease
        if ask.prefill is not None:
            self._counted_here.add(lease.id)
        return None

    def _locally(self, ask: Ask) -> tuple[Ask, list[int], list[int]]:
        """The ask as this replica decides it alone, and which of the original slots and
        charges each of its own stands for."""
        policy, live = self._policy, max(1, self.live)
        slots = _kept(ask.slots, policy.concurrency)
        charges = _kept(ask.charges, policy.rates)
        local = Ask(
            ask.cooldowns,
            tuple(Slot(ask.slots[i].key, math.ceil(ask.slots[i].limit / live)) for i in slots),
            tuple(_charge_share(ask.charges[i], live) for i in charges),
            prefill=ask.prefill,
        )
        return local, slots, charges

    async def renew(self, leases: Sequence[Lease], ttl_s: float) -> None:
        local = [lease for lease in leases if lease.id in self._local_leases]
        if local:
            await self._local.renew(local, ttl_s)
        if self.degraded:
            return
        shared = [lease for lease in leases if lease.id not in self._local_leases]
        try:
            await self._shared.renew(shared, ttl_s)
        except StoreUnavailable as why:
            await self._failed(why)

    async def give_back(self, backs: Sequence[GiveBack]) -> None:
        """Each lease freed where it is held, its refunds applied there (here: to this
        replica's share); one the shared store may hold while it is away is released
        there once it answers again (its refunds stay here, or are lost if the store
        failed without degrading it: the reservation stands)."""
        here: list[GiveBack] = []
        refunds: list[Refund] = []
        shared: list[GiveBack] = []
        for back in backs:
            lease = back.lease
            if self._local_leases.pop(lease.id, None) is not None:
                here.append(GiveBack(lease))
                refunds += back.refunds
                self._orphan(lease)
            elif self.degraded:
                refunds += back.refunds
                self._orphan(lease)
            else:
                self._shared_leases.pop(lease.id, None)
                shared.append(back)
        if shared:
            try:
                await self._shared.give_back(shared)
            except StoreUnavailable as why:
                for back in shared:
                    self._orphan(back.lease)
                if await self._failed(why):
                    refunds += [refund for back in shared for refund in back.refunds]
        if refunds:
            live = max(1, self.live)
            shares = tuple([Refund(_charge_share(c, live), amount) for c, amount in refunds])
            here.append(GiveBack(NO_SLOTS, shares))
        if here:
            await self._local.give_back(here)

    async def prefilled(self, ends: Sequence[PrefillEnd]) -> dict[str, PrefillState]:
        """Each prompt ended where it was counted: here for one decided here, in the
        shared store otherwise; one the shared store cannot be told of now is told once
        it answers again."""
        counted_here = self._counted_here
        here = [end for end in ends if end.id in counted_here]
        shared = [end for end in ends if end.id not in counted_here]
        counted_here.difference_update([end.id for end in here])
        states = await self._local.prefilled(here) if here else {}
        if shared and self.degraded:
            self._keep_untold(shared)
        elif shared:
            try:
                states.update(await self._shared.prefilled(shared))
            except StoreUnavailable as why:
                self._keep_untold(shared)
                await self._failed(why)
        return states

    def _keep_untold(self, ends: Sequence[PrefillEnd]) -> None:
        for key, lease_id, _ in ends:
            if len(self._untold) < MAX_ORPHANS:
                self._untold[lease_id] = PrefillEnd(key, lease_id, False)

    async def _tell_ends(self) -> None:
        """In batches, each one call of the shared store."""
        untold = list(self._untold.values())
        for start in range(0, len(untold), ORPHANS_AT_ONCE):
            batch = untold[start : start + ORPHANS_AT_ONCE]
            await self._shared.prefilled(batch)
            for end in batch:
                self._untold.pop(end.id, None)

    async def cool(self, key: str, duration_s: float) -> None:
        """Kept locally as well, so that a cooldown still holds if the store goes away."""
        await self._local.cool(key, duration_s)
        if self.degraded:
            return
        try:
            await self._shared.cool(key, duration_s)
        except StoreUnavailable as why:
            await self._failed(why)

    async def in_use(self, key: str) -> int:
        if not self.degraded:
            try:
                return await self._shared.in_use(key)
            except StoreUnavailable as why:
                await self._failed(why)
        return await self._local.in_use(key)

    async def available(self, key: str, rate: Rate) -> float:
        if not self.degraded:
            try:
                return await self._shared.available(key, rate)
            except StoreUnavailable as why:
                await self._failed(why)
        return await self._local.available(key, _rate_share(rate, max(1, self.live)))


def _kept(parts: Sequence[object], when_down: WhenDown) -> list[int]:
    """Which parts of one kind a replica enforces alone (all or none)."""
    if not parts or when_down is WhenDown.FAIL_OPEN:
        return []
    if when_down is WhenDown.FAIL_CLOSED:
        raise StoreUnavailable("the limit store is unreachable and this limit fails closed")
    return list(range(len(parts)))


def _unbounded(lease: Lease) -> Ask:
    """Hold `lease`'s slots whatever is held already: it was granted elsewhere."""
    return Ask(slots=tuple(Slot(key, sys.maxsize) for key in lease.keys))


def _rate_share(rate: Rate, live: int) -> Rate:
    return Rate(rate.limit / live, rate.period_s, rate.burst / live)


def _charge_share(charge: Charge, live: int) -> Charge:
    return Charge(charge.key, _rate_share(charge.rate, live), charge.cost)


def _original(refused: Refused, slots: list[int], charges: list[int]) -> int:
    """The index in the original ask of the part of the local ask that refused."""
    if refused.part is Part.SLOT:
        return slots[refused.index]
    if refused.part is Part.CHARGE:
        return charges[refused.index]
    return refused.index
