"""A circuit breaker whose state the whole fleet shares (`breaker.scope: fleet`).

Every replica counts its outcomes and, every `sync_s`, hands them to the shared store,
which runs the same state machine over the fleet's counts and answers with the fleet's
circuit: closed, open (and for how long), or half open with the one probe of the whole
fleet given to one replica. The dispatcher's checks stay synchronous: they read the
circuit as last synced, so a circuit opened by failures on one replica refuses on every
other within two sync periods (its own next sync, then theirs). While the shared store
does not answer (its view older than three sync periods), each replica decides from its
own outcomes as a local breaker does, and hands the counts over when it answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sluicegate.capacity.breaker import Breaker, BreakerState
from sluicegate.core.clock import Clock, repeat
from sluicegate.core.limits import StoreUnavailable
from sluicegate.core.types import BreakerPolicy

log = logging.getLogger("sluicegate")


@dataclass(slots=True)
class Tally:
    """Outcomes not yet handed to the fleet, and this replica's probe result, if any."""

    ok: int = 0
    failed: int = 0
    trailing_failures: int = 0
    """Failures since the last success: what extends the fleet's run of failures."""
    probe_ok: bool | None = None

    def add(self, ok: bool, *, probe: bool) -> None:
        if probe:
            self.probe_ok = ok
            return
        if ok:
            self.ok += 1
            self.trailing_failures = 0
        else:
            self.failed += 1
            self.trailing_failures += 1

    def merge(self, later: Tally) -> Tally:
        """This tally followed by `later`."""
        trailing = later.trailing_failures
        if later.ok == 0:
            trailing += self.trailing_failures
        probe = later.probe_ok if later.probe_ok is not None else self.probe_ok
        return Tally(self.ok + later.ok, self.failed + later.failed, trailing, probe)


@dataclass(frozen=True, slots=True)
class FleetCircuit:
    state: BreakerState
    reopens_in_s: float
    """Open: seconds until the fleet lets a probe through."""
    probe_is_ours: bool
    """Half open: this replica holds the fleet's probe."""


class BreakerStore(Protocol):
    async def sync_breaker(
        self,
        name: str,
        replica: str,
        outcomes: tuple[int, int, int, bool | None],
        policy: BreakerPolicy,
    ) -> tuple[str, float, bool]:
        """Apply outcomes (successes, failures, failures since the last success, the
        probe's result) to the fleet's circuit `name`: its state afterwards, seconds
        until it reopens, and whether this replica holds the fleet's probe."""
        ...


class FleetBreaker(Breaker):
    def __init__(
        self,
        name: str,
        policy: BreakerPolicy,
        clock: Clock,
        jitter: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(policy, clock, jitter, name=name)
        self._tally = Tally()
        self._fleet_until = float("-inf")
        """Until when the fleet's view is fresh enough to decide on."""

    def _fleet_decides(self) -> bool:
        return self._clock.now() < self._fleet_until

    def allows(self) -> bool:
        if not self._fleet_decides():
            return super().allows()
        if self.state is BreakerState.OPEN:
            return False
        if self.state is BreakerState.HALF_OPEN:
            return self._probes < self.policy.half_open_probes
        return True

    def record(self, ok: bool) -> None:
        self._tally.add(ok, probe=self.state is BreakerState.HALF_OPEN)
        if not self._fleet_decides():
            super().record(ok)
            return
        self.in_flight -= 1
        if self.state is BreakerState.HALF_OPEN:
            self._probes = max(0, self._probes - 1)

    def take_tally(self) -> Tally:
        tally, self._tally = self._tally, Tally()
        return tally

    def give_back(self, tally: Tally) -> None:
        """A sync that failed: its outcomes go with the next one."""
        self._tally = tally.merge(self._tally)

    def adopt(self, circuit: FleetCircuit, fresh_for_s: float) -> None:
        """Take the fleet's circuit as this replica's until `fresh_for_s` from now."""
        now = self._clock.now()
        self._fleet_until = now + fresh_for_s
        if circuit.state is BreakerState.CLOSED:
            if self.state is not BreakerState.CLOSED:
                self._close()
            return
        if circuit.state is BreakerState.HALF_OPEN and circuit.probe_is_ours:
            if self.state is not BreakerState.HALF_OPEN:
                self._half_open()
            return
        reopens_in = circuit.reopens_in_s if circuit.state is BreakerState.OPEN else fresh_for_s
        if self.state is not BreakerState.OPEN:
            self._open(reopens_in)
        self._open_until = now + reopens_in


class BreakerSync:
    """Hands every fleet breaker's outcomes to the store each `every_s` and takes back
    the fleet's circuits: one call per deployment, off the request path."""

    def __init__(
        self,
        breakers: Sequence[FleetBreaker],
        store: BreakerStore,
        clock: Clock,
        replica: str,
        every_s: float,
    ) -> None:
        self._breakers = tuple(breakers)
        self._store = store
        self._clock = clock
        self._replica = replica
        self._every_s = every_s
        self.failures = 0

    async def run(self) -> None:
        await repeat(self._clock, self._every_s, self.sync_once)

    async def sync_once(self) -> None:
        calls = [self._sync(breaker) for breaker in self._breakers]
        await asyncio.gather(*calls)

    async def _sync(self, breaker: FleetBreaker) -> None:
        tally = breaker.take_tally()
        outcomes = (tally.ok, tally.failed, tally.trailing_failures, tally.probe_ok)
        try:
            state, reopens_in_s, ours = await self._store.sync_breaker(
                breaker.name, self._replica, outcomes, breaker.policy
            )
        except StoreUnavailable:
            breaker.give_back(tally)
            self.failures += 1
            return
        breaker.adopt(FleetCircuit(BreakerState(state), reopens_in_s, ours), 3 * self._every_s)
