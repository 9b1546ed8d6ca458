"""How often slots come free by themselves: what the rest of a handed-over answer waits on.

One of the two readings of a hand-over's pause (`handover.HandOver`), the expected
one; the other (`latest_free_s`) bounds it by the running streams' `max_tokens`.

A stream that gives its slot away stands still until a slot comes free for its rest,
so the dispatcher asks one only while the rests already waiting, and this one, would
resume within its lane's promise. That needs the time between slots coming free, and
the dispatcher's service gap (`promise.WaitPredictor.gap_s`) is not it: it is the time
between dispatches from a queue, which a batch filling at its start, or a gate
opening, sends many at once, so a burst of them reads it as a thousandth of a second
while the first answers are still seconds from ending. Only an end frees a slot
for a rest, so only ends are counted here, as a rate over recent time rather than an
average over recent events: ends that come together count for what they are, a few
in an instant, and a stall shows as the rate falling while nothing ends. Before any
end the gap is unknown, and read as endless: a promised stream is not paused on a
guess.
"""

from __future__ import annotations

import math

WINDOW_S = 5.0
"""Ends are weighed by exp(-age / WINDOW_S): the pause it bounds is a promise's few
seconds, so a slowdown must show within about as long (after three windows the old
rate weighs 5 %); a busy batch ends dozens of answers in that time, and a slow
backend's few ends still count."""


class Turnover:
    """The recent rate of slots coming free, on the dispatcher's clock from `now`."""

    def __init__(self, now: float) -> None:
        self._since_s = now
        self._at_s = now
        self._weight = 0.0
        """Ends so far, each weighed by its age as at `_at_s`."""

    def freed(self, now: float) -> None:
        """A slot came free: an attempt that went out ended, not by handing its slot over
        (that slot is its taker's, no rest waits on it)."""
        self._weight = self._weight_at(now) + 1.0
        self._at_s = now

    def gap_s(self, now: float) -> float:
        """The mean time between slots coming free lately; `math.inf` before any did.
        The ends' weights are set against the time they were counted over, so the first
        seconds, with little time behind them, read the rate they saw, not less. An idle
        spell counts as time without ends: after one, the gap reads long for a few
        windows, and fewer streams are paused meanwhile, never more."""
        weight = self._weight_at(now)
        if weight <= 0.0:
            return math.inf
        return WINDOW_S * -math.expm1((self._since_s - now) / WINDOW_S) / weight

    def _weight_at(self, now: float) -> float:
        return self._weight * math.exp((self._at_s - now) / WINDOW_S)


def latest_free_s(soonest: list[float], ahead: int, own_s: float) -> float:
    """The latest a rest behind `ahead` others gets a slot, when the streams holding
    slots end at the latest after the times in `soonest` (ascending, at least the
    `ahead + 2` soonest), one of them, ending after `own_s`, giving its slot away now:
    that one will not end by itself, so the rest waits for the `ahead + 1`-th of the
    others. `math.inf` when too few may end."""
    latest = ahead + (ahead < len(soonest) and own_s <= soonest[ahead])
    return soonest[latest] if latest < len(soonest) else math.inf
