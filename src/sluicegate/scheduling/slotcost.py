"""What a slot held by each tenant costs the engine: the weight of its in-flight count.

Sharing the backend's sequences by count is max-min fair in slots, not in the engine's
time. A tenant of long prompts and short answers spends most of its slot prefilling,
which stalls every other sequence's step; one of short prompts spends its slot in
decode steps shared with the whole batch. At equal counts the first gets several times,
even tens of times, the engine the second does. So each tenant's requests in flight
are weighed by what a second of their slot costs the engine, learnt from its requests
that ended: the engine seconds they asked (`demand.EngineUnit`) over the seconds they
held a slot.
"""

from __future__ import annotations

import math

SMOOTHING = 0.1
"""Weight of the newest request in a tenant's sums: about its last ten requests count."""
SKEW = 8.0
"""A tenant's slot is deemed to cost at most this many times, and at least this part of,
what the average tenant's does: learnt from a few requests, a cost is not trusted to
give one tenant the whole batch or none of it."""
LEAST = 1e-9
"""Engine seconds per second held below which a slot is deemed to cost this: a request
that asked nothing of the engine has a cost whose logarithm is defined."""


class SlotCosts:
    """Per tenant: engine seconds per second of a slot held, relative to the average
    over the tenants seen (1 for one not yet seen, and for all of them before any).
    The average is geometric: one tenant's first, odd request must not move the others
    to a bound of `SKEW` and so erase their differences."""

    def __init__(self) -> None:
        self._sums: dict[str, tuple[float, float]] = {}
        """Per tenant: smoothed engine seconds asked and seconds held, per request."""
        self._logs: dict[str, float] = {}
        """Per tenant: the logarithm of its engine seconds per second held."""
        self._total = 0.0
        """The sum of `_logs`, kept as they change: the average costs no walk."""
        self._rates: dict[str, float] = {}
        """Per tenant: its engine seconds per second held."""
        self._mean = 1.0
        """The geometric average of `_rates`, worked out as a request ends: the fair order
        reads each tenant's relative cost at every pick."""

    def held(self, flow: str, work_s: float, held_s: float) -> None:
        """One of `flow`'s requests held a slot `held_s` and asked `work_s` of the engine.
        Sums, not a mean of ratios: a long request weighs what it held."""
        if held_s <= 0 or work_s < 0:
            return
        found = self._sums.get(flow)
        if found is None:
            work, held = work_s, held_s
        else:
            work = found[0] + SMOOTHING * (work_s - found[0])
            held = found[1] + SMOOTHING * (held_s - found[1])
        self._sums[flow] = (work, held)
        rate = self._rates[flow] = max(LEAST, work / held)
        log = math.log(rate)
        self._total += log - self._logs.get(flow, 0.0)
        self._logs[flow] = log
        self._mean = math.exp(self._total / len(self._logs))

    def view(self) -> dict[str, float]:
        """Every tenant seen, with its `relative` cost."""
        return {flow: self.relative(flow) for flow in self._rates}

    def relative(self, flow: str) -> float:
        """`flow`'s cost per slot-second over the average tenant's, within `SKEW`."""
        rate = self._rates.get(flow)
        if rate is None:
            return 1.0
        return min(SKEW, max(1.0 / SKEW, rate / self._mean))
