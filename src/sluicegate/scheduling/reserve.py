"""Slots kept free for requests within their tenant's share.

A backend runs a batch, and a request that finds the batch full waits for a completion,
whatever its place in the fair order: the order decides who goes next, not that anyone
goes now. Max-min fairness promises more to a tenant using less than its share: its
request should not wait behind work of tenants above theirs, and without preemption the
only way is to keep slots free for it. So work above its share (and work of lower lanes)
may take a pool's slots only while `slots()` of them stay free; a request of the top
lane within its tenant's share may take any.

How many: each arrival within its share takes a free slot, and each completion gives one back
to the free ones first, since nothing else may take it while they are short. With
within-share arrivals at rate L and completions one per measured service gap, the free
slots behave as an M/M/1/R queue whose load is L x gap, and an arrival finds none free
with its blocking probability. `slots()` is the fewest R that keep it under `BLOCKING`,
at most `most_of_batch` of the batch (`scheduling.reserve`, 0 turns it off): the reserve
is throughput held back from the others, so it follows the within-share traffic and is
nothing without any.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from sluicegate.core.clock import Clock
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.plugin import Quiet

BLOCKING = 0.05
"""A request within its share should find a free slot at least 95 times in 100."""
MOST_OF_BATCH = 0.25
"""By default never more than this share of the batch is held back."""
HORIZON_S = 10.0
"""The within-share arrival rate is a count decayed over this time."""
GONE_AFTER_S = 3 * HORIZON_S
"""Protected traffic silent this long is gone whatever its rate: the reserve is given
back to the others. Its decayed rate alone would keep a slot for minutes."""
GONE_AFTER_GAPS = 5
"""Protected traffic is also gone once silent for this many of its own mean gaps: a
burst of within-share arrivals that stops (closed loops grown beyond their share) must
not keep slots idle for the whole `GONE_AFTER_S`."""
REFRESH_S = 0.05
"""The reserve is worked out again at most this often: dispatches ask for it each time."""


def blocking(load: float, slots: int) -> float:
    """The probability that an M/M/1 queue truncated at `slots` is full (its stationary
    distribution is geometric in the load). Written so that no power overflows: above
    load 1 the powers are of its inverse."""
    if slots == 0:
        return 1.0
    if abs(load - 1.0) < 1e-9:
        return 1.0 / (slots + 1)
    if load < 1.0:
        return (1.0 - load) * load**slots / (1.0 - load ** (slots + 1))
    return (load - 1.0) / (load - (1.0 / load) ** slots)


class Reserve:
    """The free slots one dispatcher keeps for requests within their share; times on its clock."""

    def __init__(self, batch: int, most_of_batch: float = MOST_OF_BATCH) -> None:
        self.most = math.floor(batch * most_of_batch)
        self._rate = 0.0
        self._rate_at = -math.inf
        self._gone_at = -math.inf
        self._slots = 0
        self._worked_out_at = -math.inf
        self.arrivals = 0
        """Protected arrivals so far, for operators."""

    def arrived(self, now: float) -> None:
        """A request within its tenant's share arrived."""
        self._rate = self.rate_per_s(now) + 1.0 / HORIZON_S
        self._rate_at = now
        self._gone_at = now + min(GONE_AFTER_S, GONE_AFTER_GAPS / self._rate)
        self.arrivals += 1

    def rate_per_s(self, now: float) -> float:
        return self._rate * math.exp(-(now - self._rate_at) / HORIZON_S)

    def slots(self, now: float, gap_s: float | None) -> int:
        """How many slots work beyond its share must leave free now; none before
        any service gap was measured (nothing has waited for a slot yet)."""
        if now - self._worked_out_at < REFRESH_S:
            return self._slots
        self._worked_out_at = now
        self._slots = self.slots_at(now, gap_s)
        return self._slots

    def slots_at(self, now: float, gap_s: float | None) -> int:
        """`slots`, worked out afresh and kept nowhere."""
        gone = now > self._gone_at
        load = 0.0 if gap_s is None or gone else self.rate_per_s(now) * gap_s
        slots = 0
        if load > 0:
            while slots < self.most and blocking(load, slots) > BLOCKING:
                slots += 1
        return slots


class SpareSlots(Quiet):
    """How many slots must an attempt leave free, and where? Work beyond its share and
    lower lanes leave the reserve free, split over the deployments in proportion to
    what each takes at once (rounded down, the rest one each from the first), never
    all of one."""

    def __init__(
        self,
        targets: Sequence[Target],
        most_of_batch: float,
        clock: Clock,
        gap_s: Callable[[], float | None],
    ) -> None:
        self._targets = tuple(targets)
        self._batch = sum(target.full for target in self._targets)
        self.reserve = Reserve(self._batch, most_of_batch)
        self._clock = clock
        self._gap_s = gap_s
        self._splits: dict[int, dict[str, int]] = {}

    def arrived(self, attempt: Attempt, within_share: bool) -> None:
        if within_share:
            self.reserve.arrived(self._clock.now())

    def spare(self, within_share: bool) -> int:
        """The slots an attempt must leave free over all the deployments."""
        if within_share or not self.reserve.most:
            return 0
        return self.reserve.slots(self._clock.now(), self._gap_s())

    def at(self, spare: int, target: Target) -> int:
        """`target`'s part of `spare` slots."""
        split = self._splits.get(spare)
        if split is None:
            split = self._splits[spare] = self._split(spare)
        return split[target.deployment.name]

    def _split(self, spare: int) -> dict[str, int]:
        targets, batch = self._targets, self._batch
        parts = [spare * target.full // batch for target in targets]
        for index in range(spare - sum(parts)):
            parts[index % len(parts)] += 1
        return {
            target.deployment.name: min(part, target.full - 1)
            for target, part in zip(targets, parts, strict=True)
        }

    def view(self) -> tuple[int, int]:
        """The slots kept free now, and the within-share arrivals so far."""
        slots = self.reserve.slots_at(self._clock.now(), self._gap_s()) if self.reserve.most else 0
        return slots, self.reserve.arrivals
