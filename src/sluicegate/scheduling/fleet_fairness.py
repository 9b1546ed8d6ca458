"""Fair shares across replicas (`scheduling.fairness_scope: fleet`).

A replica can only dispatch the requests it holds, so sharing the virtual token
counters is not enough: a replica whose only tenant is ahead of tenants waiting on
another replica would still take every slot it can get. The fleet's state is therefore
two things in the shared store, per model and lane: the counters, and the set of flows
waiting anywhere (what the lift rule needs). Every `sync_s` a replica hands over the
service it charged and the flows waiting on it, and takes back every waiting flow's
counter. Between syncs it orders its own flows as a local VTC does, with its charges
added at once, and it *holds back*: it dispatches nothing while its least-served flow
is ahead of a flow waiting elsewhere by more than `slack` (two dispatches' worth of
service), so the slot goes to the replica holding the flow that is behind. The fleet's
view is at most two sync periods old; without a fresh one (the store away) a replica
orders its own flows only, as a local VTC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from sluicegate.core.clock import Clock, repeat
from sluicegate.core.limits import StoreUnavailable
from sluicegate.scheduling.fairness import VirtualTokenCounter, comes_within_share


class FairnessStore(Protocol):
    async def sync_fairness(
        self,
        name: str,
        replica: str,
        charged: Mapping[str, float],
        waiting: Sequence[str],
        idle: Sequence[str],
        ttl_s: float,
        held: Mapping[str, int],
    ) -> tuple[dict[str, float], dict[str, int]]:
        """Add `charged` to the fleet's counters of `name`, mark `waiting` as waiting on
        this replica (for `ttl_s`) and `idle` as no longer, and say how many requests
        each flow holds here, in flight or queued (for `ttl_s`); every waiting flow's
        counter, and each flow's requests held on the other replicas."""
        ...


class FleetVirtualTokenCounter(VirtualTokenCounter):
    def __init__(
        self,
        name: str,
        clock: Clock,
        weights: Mapping[str, float] | None = None,
        input_weight: float = 1.0,
        output_weight: float = 2.0,
    ) -> None:
        super().__init__(weights, input_weight, output_weight)
        self.name = name
        self._clock = clock
        self._charged: dict[str, float] = {}
        self._idle: set[str] = set()
        self._elsewhere: dict[str, float] = {}
        """Flows waiting on other replicas only, with their counters as last synced."""
        self._held_elsewhere: dict[str, int] = {}
        """Each flow's requests in flight or queued on the other replicas, as last
        synced."""
        self._fresh_until = float("-inf")
        self._cost = 0.0
        """Mean service of one dispatch (smoothed): the unit of the slack."""
        self.held = 0
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Called after each sync: a replica holding back may dispatch again."""
        self._listeners.append(listener)

    def backlogged(self, flow: str) -> None:
        if flow in self._backlog:
            return
        if self._clock.now() < self._fresh_until and self._elsewhere:
            low = min(self._elsewhere.values())
            self.counters[flow] = max(self.counters.get(flow, 0.0), low)
        self._idle.discard(flow)
        super().backlogged(flow)

    def idle(self, flow: str) -> None:
        super().idle(flow)
        self._idle.add(flow)

    def pick(self) -> str | None:
        flow = super().pick()
        if flow is None or not self._elsewhere or self._clock.now() >= self._fresh_until:
            return flow
        if self.counters[flow] > min(self._elsewhere.values()) + 2 * self._cost:
            self.held += 1
            return None
        return flow

    def within_share(self, flow: str, queued: Callable[[str], int], capacity: float) -> bool:
        """As a local VTC judges it, over the fleet's requests: this replica's own counts
        and the other replicas' as last synced (while fresh), so a tenant alone on its
        replica is not taken for the only one. The others' queued requests count as
        well as their requests in flight: a burst the kernel spread over two replicas
        is one tenant's demand, and counted on each replica's half alone it came within
        its share twice."""
        elsewhere = self._held_elsewhere
        if not elsewhere or self._clock.now() >= self._fresh_until:
            return super().within_share(flow, queued, capacity)
        fleet = _summed(elsewhere, self._in_flight)
        weights = self._weight
        return comes_within_share(flow, fleet, weights, self._backlog, queued, capacity)

    def charge(self, flow: str, prompt_tokens: float, output_tokens: float) -> None:
        before = self.counters.get(flow, 0.0)
        super().charge(flow, prompt_tokens, output_tokens)
        amount = self.counters[flow] - before
        self._charged[flow] = self._charged.get(flow, 0.0) + amount
        if amount > 0:
            self._cost = amount if self._cost == 0 else 0.9 * self._cost + 0.1 * amount

    async def sync(
        self, store: FairnessStore, replica: str, every_s: float, queued: Mapping[str, int]
    ) -> None:
        """Trade what this replica charged and holds (in flight and `queued` here) for
        the fleet's counters and what the other replicas hold."""
        charged, self._charged = self._charged, {}
        idle, self._idle = list(self._idle), set()
        try:
            fleet, self._held_elsewhere = await store.sync_fairness(
                self.name,
                replica,
                charged,
                list(self._backlog),
                idle,
                3 * every_s,
                _summed(self._in_flight, queued),
            )
        except StoreUnavailable:
            for flow, amount in charged.items():
                self._charged[flow] = self._charged.get(flow, 0.0) + amount
            self._idle.update(idle)
            return
        for flow, counter in fleet.items():
            self.counters[flow] = counter + self._charged.get(flow, 0.0)
        self._elsewhere = {f: c for f, c in self.counters.items() if f in fleet}
        for flow in self._backlog:
            self._elsewhere.pop(flow, None)
        self._fresh_until = self._clock.now() + 2 * every_s
        for listener in self._listeners:
            listener()


def _summed(one: Mapping[str, int], other: Mapping[str, int]) -> dict[str, int]:
    """Per-flow counts added up."""
    total = dict(one)
    for flow, count in other.items():
        total[flow] = total.get(flow, 0) + count
    return total


Queued = Callable[[], Mapping[str, int]]
"""A lane's requests queued on this replica, per flow."""


class FairnessSync:
    """Syncs every fleet fairness policy each `every_s`, one store call per lane."""

    def __init__(
        self,
        policies: Sequence[tuple[FleetVirtualTokenCounter, Queued]],
        store: FairnessStore,
        clock: Clock,
        replica: str,
        every_s: float,
    ) -> None:
        self._policies = tuple(policies)
        self._store = store
        self._clock = clock
        self._replica = replica
        self._every_s = every_s

    async def run(self) -> None:
        await repeat(self._clock, self._every_s, self.sync_once)

    async def sync_once(self) -> None:
        store, replica, every_s = self._store, self._replica, self._every_s
        calls = [p.sync(store, replica, every_s, queued()) for p, queued in self._policies]
        await asyncio.gather(*calls)
