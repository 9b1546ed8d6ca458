"""Lower lanes yield to the top lane's time to first token.

Static shares and paces must be set for the worst case and waste capacity the rest of
the time. This controller paces every lane below the top one by feedback
instead. When the top lane becomes active, the lower lanes are held to the rate
they had (so a wave of background completions is not refilled at once); while the
top lane's recent time to first token is above its target, that rate is cut
multiplicatively; while it is within, the rate grows back additively (up to twice what
the lower lanes really use); once the top lane has been quiet for a window
there is nothing to protect and the limit is lifted, so background work runs at full
speed.

It paces dispatches rather than capping concurrency because what lengthens a waiting
request's first token on a continuous-batching backend is the prefills it shares its
engine steps with; the lower lanes' concurrency follows the rate within seconds.
"""

from __future__ import annotations

from collections import deque

from sluicegate.core.clock import Clock

DECIDE_S = 1.0
"""How often the rate is adjusted; a decision uses the samples since the previous one."""
QUIET_S = 2.0
"""No top-lane sample for this long: the top lane is idle, the limit is lifted."""
CUT_RANGE = (0.5, 0.9)
"""Multiplicative decrease on a breach: target / observed, within these bounds, so a
slight breach costs little and a large one halves the rate."""
GROWTH = 0.1
"""Additive increase per calm decision, as a fraction of the rate measured when the
limit first engaged (so the step scales with the backend and the request sizes)."""
MEASURE_S = 10.0
"""The lower lanes' rate when the limit engages is measured over this long: long enough
to see a burst that was dispatched before the top lane woke up."""
FLOOR_RATE_PER_S = 0.05
"""Lower lanes always keep this rate: starved forever is not yielding."""
QUANTILE = 0.95


class Yielding:
    def __init__(self, target_s: float, clock: Clock) -> None:
        self.target_s = target_s
        self.rate_per_s: float | None = None
        """The lower lanes' dispatch rate limit; None while unlimited."""
        self.cuts = 0
        self._clock = clock
        self._samples: list[float] = []
        self._last_sample_s = float("-inf")
        self._decided_s = clock.now()
        self._step = FLOOR_RATE_PER_S
        self._dispatches: deque[float] = deque()
        self._next_s = float("-inf")

    def observe(self, ttft_s: float) -> None:
        """A top-lane request's time to first token."""
        self._samples.append(ttft_s)
        self._last_sample_s = self._clock.now()

    def dispatched(self) -> None:
        """A lower lane dispatched; spaces the next one by the current rate."""
        now = self._clock.now()
        self._dispatches.append(now)
        while self._dispatches[0] < now - MEASURE_S:
            self._dispatches.popleft()
        if self.rate_per_s is not None:
            self._next_s = max(self._next_s, now) + 1.0 / self.rate_per_s

    def wait_s(self) -> float:
        """How long a lower lane must wait before its next dispatch (0: it may go now)."""
        now = self._clock.now()
        if now - self._decided_s >= DECIDE_S:
            self._decide(now)
        if self.rate_per_s is None:
            return 0.0
        return max(0.0, self._next_s - now)

    def _decide(self, now: float) -> None:
        samples, self._samples = sorted(self._samples), []
        self._decided_s = now
        if now - self._last_sample_s > QUIET_S:
            self.rate_per_s = None
            return
        if not samples:
            return
        measured = self._measured_rate(now)
        if self.rate_per_s is None:
            self._step = max(FLOOR_RATE_PER_S, GROWTH * measured)
            self.rate_per_s = max(FLOOR_RATE_PER_S, measured)
        worst = samples[min(len(samples) - 1, int(QUANTILE * len(samples)))]
        if worst > self.target_s:
            cut = min(CUT_RANGE[1], max(CUT_RANGE[0], self.target_s / worst))
            self.rate_per_s = max(FLOOR_RATE_PER_S, self.rate_per_s * cut)
            self._next_s = min(self._next_s, now + 1.0 / self.rate_per_s)
            self.cuts += 1
        else:
            ceiling = max(2.0 * measured, self.rate_per_s)
            self.rate_per_s = min(self.rate_per_s + self._step, ceiling)

    def _measured_rate(self, now: float) -> float:
        return sum(1 for t in self._dispatches if t >= now - MEASURE_S) / MEASURE_S
