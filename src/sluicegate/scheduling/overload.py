"""Named overload states, entered from measured pressure with hysteresis.

Pressure is the worst of: the interactive lanes' oldest queue wait and recent p95
time to first token against their TTFT promise, and the backends' decode time per
token against the interactive TPOT promise while interactive requests are running
(a backend busy with background prefills alone slows nobody the top lane protects).
Each state turns on more of the fallback ladder (see `Ladder`); a state is left only
once pressure has stayed below its threshold x `leave_ratio` for `hold_s`, so a brief
dip does not flap it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

from sluicegate.capacity.gates import MetricsGate
from sluicegate.core.clock import Clock, sleep_until
from sluicegate.core.types import OverloadPolicy, OverloadState, Scheduling
from sluicegate.scheduling.dispatcher import Dispatcher

log = logging.getLogger("sluicegate.overload")


class TtftWindow:
    """Recent times to first token of the top lane (at most `size`, none older than
    `horizon_s`), for a p95 that forgets an episode once it is over."""

    def __init__(self, clock: Clock, size: int = 200, horizon_s: float = 30.0) -> None:
        self._clock = clock
        self._horizon_s = horizon_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._samples.append((self._clock.now(), seconds))

    def p95(self) -> float | None:
        oldest = self._clock.now() - self._horizon_s
        while self._samples and self._samples[0][0] < oldest:
            self._samples.popleft()
        if len(self._samples) < 5:
            return None
        ordered = sorted(value for _, value in self._samples)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class OverloadMonitor:
    def __init__(self, policy: OverloadPolicy, clock: Clock) -> None:
        self.policy = policy
        self.state = OverloadState.NORMAL
        self.pressure = 0.0
        self.transitions = 0
        self._clock = clock
        self._calm_since: float | None = None

    def observe(self, ratios: Iterable[float | None]) -> OverloadState:
        """Feed the current signal/promise ratios; returns the (possibly new) state."""
        self.pressure = max((r for r in ratios if r is not None), default=0.0)
        target = self._level(self.pressure)
        now = self._clock.now()
        if target > self.state:
            self._move(target)
            self._calm_since = None
        elif target < self.state:
            calm = self.pressure < self.policy.threshold(self.state) * self.policy.leave_ratio
            if not calm:
                self._calm_since = None
            elif self._calm_since is None:
                self._calm_since = now
            elif now - self._calm_since >= self.policy.hold_s:
                self._move(OverloadState(self.state - 1))
                self._calm_since = now
        return self.state

    def _level(self, pressure: float) -> OverloadState:
        reached = [s for s in OverloadState if pressure >= self.policy.threshold(s)]
        return max(reached)

    def _move(self, state: OverloadState) -> None:
        level = logging.WARNING if state > self.state else logging.INFO
        log.log(
            level,
            "overload state %s -> %s (pressure %.2f)",
            self.state.name.lower(),
            state.name.lower(),
            self.pressure,
            extra={"repeat_key": ("overload", state)},
        )
        self.state = state
        self.transitions += 1


class OverloadWatch:
    """Measures pressure on the top lane's promise every `interval_s` and feeds the
    monitor; a change of state wakes the dispatchers (a lane may have been unpaused)."""

    def __init__(
        self,
        monitor: OverloadMonitor,
        scheduling: Scheduling,
        dispatchers: Iterable[Dispatcher],
        gates: Iterable[MetricsGate],
        window: TtftWindow,
        clock: Clock,
    ) -> None:
        self._monitor = monitor
        self._top = scheduling.top
        self._interval_s = scheduling.overload.interval_s
        self._dispatchers = list(dispatchers)
        self._gates = list(gates)
        self._window = window
        self._clock = clock

    def ratios(self) -> list[float | None]:
        top = self._top
        if top.ttft_slo_s is None and top.tpot_slo_s is None:
            return []
        lanes = [dispatcher.lane_view(top.name) for dispatcher in self._dispatchers]
        found: list[float | None] = []
        if top.ttft_slo_s is not None:
            found += [lane.oldest_age_s / top.ttft_slo_s for lane in lanes if lane.queued]
            p95 = self._window.p95()
            found.append(None if p95 is None else p95 / top.ttft_slo_s)
        if top.tpot_slo_s is not None and any(lane.in_flight for lane in lanes):
            found += [
                None if gate.tpot_s is None else gate.tpot_s / top.tpot_slo_s
                for gate in self._gates
            ]
        return found

    def tick(self) -> OverloadState:
        before = self._monitor.state
        after = self._monitor.observe(self.ratios())
        if after != before:
            for dispatcher in self._dispatchers:
                dispatcher.kick()
        return after

    async def run(self) -> None:
        while True:
            await sleep_until(self._clock, self._clock.now() + self._interval_s)
            self.tick()
