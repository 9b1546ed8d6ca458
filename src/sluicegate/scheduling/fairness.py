"""Fairness policies: which backlogged flow (tenant) is served next?

A policy answers that one question and is told when a flow becomes backlogged or idle
and what each dispatch cost; the queues own the requests themselves. Whether a
newcomer comes within its flow's fair share is a second question (`Shares`), answered
from the flows' requests in flight: a policy whose order reads those counts (VTC)
answers it too, any other is paired with `CountedShares`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

ROUNDING = 1e-9
"""Slack for float products meant to be whole (2/3 x 3 is not quite 2)."""


class FairnessPolicy(Protocol):
    def backlogged(self, flow: str) -> None:
        """`flow`'s queue went from empty to non-empty."""
        ...

    def idle(self, flow: str) -> None:
        """`flow`'s queue became empty."""
        ...

    def pick(self) -> str | None:
        """The backlogged flow to serve next (no side effect); None when none is."""
        ...

    def pick_from(self, flows: Iterable[str]) -> str | None:
        """Of these backlogged flows, the one the fair order serves first (no side
        effect, no holding back); None when `flows` is empty."""
        ...

    def service(self) -> Mapping[str, float]:
        """Each flow's service counter, for operators; empty when the policy keeps none."""
        ...

    def charge(self, flow: str, prompt_tokens: float, output_tokens: float) -> None:
        """Account one dispatch's service to `flow`; a later call with a negative amount
        corrects an estimate once the real usage is known."""
        ...

    def turns_before(self, flow: str, mine: int, other: str, queued: int) -> int:
        """How many of `other`'s `queued` waiting requests go before the newcomer of
        `flow` that has `mine` of its own waiting ahead of it, if nothing else arrives:
        the fair order as `pick` will walk it, for predicting that newcomer's wait."""
        ...


class Shares(Protocol):
    """Does a newcomer of a flow come within its max-min fair share of the backend?"""

    def in_flight(self, flow: str, change: int) -> None:
        """`flow` has `change` more (or, negative, fewer) requests at the backend."""
        ...

    def within_share(self, flow: str, queued: Callable[[str], int], capacity: float) -> bool:
        """Whether a newcomer of `flow` comes within its max-min fair share of `capacity`
        requests at the backend: fewer requests of its flow before it (in flight and
        `queued(flow)`) than its share, the demands being each flow's requests in flight
        and queued, the newcomer's included. A burst is within up to its share; a flow
        that holds what others left it is not, once it asks for more."""
        ...


class Fairness(FairnessPolicy, Shares, Protocol):
    """A lane's fairness: its fair order, and the share verdict over the counts that
    order keeps."""


def max_min_level(
    demands: Mapping[str, float], weights: Callable[[str], float], capacity: float
) -> float:
    """The water level of a max-min fair split of `capacity` by weight: a flow asking
    less than level x weight gets what it asks, every other one level x weight; infinite
    when the demands all fit."""
    left, weight = capacity, sum(weights(flow) for flow in demands)
    for flow in sorted(demands, key=lambda f: demands[f] / weights(f)):
        share = weights(flow)
        if demands[flow] > left * share / weight:
            return left / weight
        left -= demands[flow]
        weight -= share
    return math.inf


def comes_within_share(
    flow: str,
    in_flight: Mapping[str, int],
    weights: Callable[[str], float],
    backlog: Iterable[str],
    queued: Callable[[str], int],
    capacity: float,
) -> bool:
    """`FairnessPolicy.within_share` over the given counts: what every policy asks, and
    the fleet's asks over the whole fleet's requests in flight and queued."""
    before = in_flight.get(flow, 0) + queued(flow)
    if before == 0:
        return True
    if before >= capacity:
        return False
    demands: dict[str, float] = dict(in_flight)
    for other in backlog:
        demands[other] = demands.get(other, 0) + queued(other)
    demands[flow] = before + 1
    share = max_min_level(demands, weights, capacity) * weights(flow)
    return before < share - ROUNDING


class RoundRobin:
    """Visit backlogged flows in turn, one request each: fair by count, blind to cost."""

    def __init__(self) -> None:
        self._order: dict[str, None] = {}
        self._in_flight: dict[str, int] = {}

    def backlogged(self, flow: str) -> None:
        self._order[flow] = None

    def idle(self, flow: str) -> None:
        self._order.pop(flow, None)

    def pick(self) -> str | None:
        return next(iter(self._order), None)

    def pick_from(self, flows: Iterable[str]) -> str | None:
        wanted = set(flows)
        return next((flow for flow in self._order if flow in wanted), None)

    def service(self) -> Mapping[str, float]:
        return {}

    def charge(self, flow: str, prompt_tokens: float, output_tokens: float) -> None:
        """A dispatch sends its flow to the back of the round; corrections change nothing."""
        if (prompt_tokens > 0 or output_tokens > 0) and flow in self._order:
            del self._order[flow]
            self._order[flow] = None

    def turns_before(self, flow: str, mine: int, other: str, queued: int) -> int:
        """A round takes one from each flow: `other` sends one per turn of `flow`."""
        return min(queued, mine + 1)

    def in_flight(self, flow: str, change: int) -> None:
        """A round gives each flow one request whatever it has in flight; the count only
        tells who is within its share."""
        adjust(self._in_flight, flow, change)

    def within_share(self, flow: str, queued: Callable[[str], int], capacity: float) -> bool:
        return comes_within_share(flow, self._in_flight, _equal, self._order, queued, capacity)


class VirtualTokenCounter:
    """Serve the backlogged flow with the fewest requests in flight for its weight, and
    of those the one that has received the least weighted service.

    The first key makes the allocation of the batch's slots max-min fair: a flow using
    less than its weight's share (a small closed loop, a tenant that just arrived) goes
    before every flow using more, whatever their counters, and is never queued behind
    one above its share. The second is the
    Virtual Token Counter (Sheng et al., OSDI 2024): service is prompt tokens x
    `input_weight` plus output tokens x `output_weight`, divided by the flow's weight,
    and a flow that becomes backlogged is lifted to the least counter among the
    backlogged ones, so time spent idle is not banked as credit to monopolise the
    backend later. It orders flows with as many in flight, which under load is most
    picks: every flow at its share.
    """

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        input_weight: float = 1.0,
        output_weight: float = 2.0,
    ) -> None:
        self._weights = dict(weights or {})
        self._input_weight = input_weight
        self._output_weight = output_weight
        self.counters: dict[str, float] = {}
        self._backlog: dict[str, None] = {}
        self._in_flight: dict[str, int] = {}

    def backlogged(self, flow: str) -> None:
        if flow in self._backlog:
            return
        own = self.counters.get(flow, 0.0)
        if self._backlog:
            own = max(own, min(self.counters[f] for f in self._backlog))
        self.counters[flow] = own
        self._backlog[flow] = None

    def idle(self, flow: str) -> None:
        self._backlog.pop(flow, None)

    def service(self) -> Mapping[str, float]:
        return dict(self.counters)

    def pick(self) -> str | None:
        return min(self._backlog, key=self._order, default=None)

    def pick_from(self, flows: Iterable[str]) -> str | None:
        return min(flows, key=self._order, default=None)

    def _order(self, flow: str) -> tuple[float, float]:
        return self._in_flight.get(flow, 0) / self._weight(flow), self.counters[flow]

    def _weight(self, flow: str) -> float:
        return self._weights.get(flow, 1.0)

    def in_flight(self, flow: str, change: int) -> None:
        adjust(self._in_flight, flow, change)

    def within_share(self, flow: str, queued: Callable[[str], int], capacity: float) -> bool:
        in_flight, weights = self._in_flight, self._weight
        return comes_within_share(flow, in_flight, weights, self._backlog, queued, capacity)

    def charge(self, flow: str, prompt_tokens: float, output_tokens: float) -> None:
        cost = prompt_tokens * self._input_weight + output_tokens * self._output_weight
        self.counters[flow] = self.counters.get(flow, 0.0) + cost / self._weights.get(flow, 1.0)

    def turns_before(self, flow: str, mine: int, other: str, queued: int) -> int:
        """The newcomer goes once `flow` holds `mine` more in flight; until then `other`
        is picked while its in-flight count per weight stays at or below `flow`'s
        (ties counted against the newcomer: a prediction may err long, not short). The
        requests waiting are taken to cost alike, so the counters' order is that of the
        in-flight counts."""
        weight, in_flight = self._weight, self._in_flight
        other_weight = weight(other)
        level = (in_flight.get(flow, 0) + mine) / weight(flow)
        room = level * other_weight - in_flight.get(other, 0)
        return 0 if room < 0 else min(queued, math.floor(room + ROUNDING) + 1)


def _equal(flow: str) -> float:
    return 1.0


def adjust(counts: dict[str, int], flow: str, change: int) -> None:
    """Counts kept without zeros, so that their keys are the flows with any."""
    now = counts.get(flow, 0) + change
    if now:
        counts[flow] = now
    else:
        counts.pop(flow, None)
