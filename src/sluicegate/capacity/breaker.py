"""A circuit breaker per deployment, and the ramp that follows every recovery.

Closed: attempts flow and outcomes are counted. Open: the deployment takes nothing
until `open_s` has passed. Half-open: a few probes go through; a success closes the
circuit, a failure opens it again for twice as long (up to `max_open_s`), so a short
outage costs a short wait and a long one only an occasional probe. After a close, and
after a throttle cooldown, the deployment's concurrency ramps from `ramp_from` to its
full limit over `ramp_s`, with jitter so that replicas do not step in lockstep. The
counts are this process's own; a shared store can hold them later behind the same
methods.
"""

from __future__ import annotations

import enum
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sluicegate.core.clock import Clock
from sluicegate.core.types import BreakerPolicy

log = logging.getLogger("sluicegate.circuit")


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerView:
    state: BreakerState
    opened: int
    """Times the circuit opened."""
    in_flight: int


class Breaker:
    def __init__(
        self,
        policy: BreakerPolicy,
        clock: Clock,
        jitter: Callable[[], float] | None = None,
        *,
        name: str = "-",
    ) -> None:
        self.name = name
        """The deployment's, for the log lines of its transitions."""
        self.policy = policy
        self.state = BreakerState.CLOSED
        self.in_flight = 0
        self.opened = 0
        self._clock = clock
        self._jitter = jitter or random.Random().random
        self._outcomes: deque[bool] = deque(maxlen=policy.window)
        self._consecutive = 0
        self._open_until = 0.0
        self._open_for = policy.open_s
        self._probes = 0
        self._ramp: tuple[float, float] | None = None

    def view(self) -> BreakerView:
        return BreakerView(self.state, self.opened, self.in_flight)

    def allows(self) -> bool:
        """May an attempt start now (ignoring the ramp, see `limit`)?"""
        if self.state is BreakerState.OPEN:
            if self._clock.now() < self._open_until:
                return False
            self._half_open()
        if self.state is BreakerState.HALF_OPEN:
            return self._probes < self.policy.half_open_probes
        return True

    def reopens_in(self) -> float | None:
        """Seconds until an open circuit lets probes through; None when not open."""
        if self.state is not BreakerState.OPEN:
            return None
        return max(0.0, self._open_until - self._clock.now())

    def spread(self, wait_s: float | None) -> float | None:
        """When to tell a refused caller to come back: the reopening (or the cooldown's
        end) plus a random part of the ramp that follows it. Callers told the same second
        would all return to a deployment that then admits them a few at a time."""
        if wait_s is None:
            return None
        return wait_s + self._jitter() * self.policy.ramp_s

    def ramp_starts_in(self) -> float | None:
        """Seconds until a scheduled ramp begins (a cooldown still running); else None."""
        if self._ramp is None:
            return None
        wait = self._ramp[0] - self._clock.now()
        return wait if wait > 0 else None

    def limit(self, full: int) -> float:
        """Attempts allowed at once while ramping up after a recovery; `full` otherwise."""
        if self._ramp is None:
            return full
        start, length = self._ramp
        elapsed = self._clock.now() - start
        if elapsed < 0:
            return 0
        if elapsed >= length:
            self._ramp = None
            return full
        begin = min(self.policy.ramp_from, full)
        return begin + (full - begin) * elapsed / length

    def started(self) -> None:
        self.in_flight += 1
        if self.state is BreakerState.HALF_OPEN:
            self._probes += 1

    def abandoned(self) -> None:
        """An attempt ended without evidence either way (cancelled, its caller gone, a
        lost hedge): a probe gives its slot back and the state stays as it is."""
        self.in_flight -= 1
        if self.state is BreakerState.HALF_OPEN:
            self._probes = max(0, self._probes - 1)

    def record(self, ok: bool) -> None:
        self.in_flight -= 1
        if self.state is BreakerState.HALF_OPEN:
            self._probes = max(0, self._probes - 1)
            if ok:
                self._close()
            else:
                self._open(min(self.policy.max_open_s, 2 * self._open_for))
            return
        if self.state is BreakerState.OPEN:
            return
        self._outcomes.append(ok)
        self._consecutive = 0 if ok else self._consecutive + 1
        if self._consecutive >= self.policy.consecutive_failures or self._ratio_tripped():
            self._open(self.policy.open_s)

    def ramp_after(self, delay_s: float) -> None:
        """Start a ramp when a cooldown of `delay_s` ends (a provider throttled us)."""
        self._start_ramp(self._clock.now() + delay_s)

    def _ratio_tripped(self) -> bool:
        seen = len(self._outcomes)
        if seen < self.policy.min_attempts:
            return False
        failures = seen - sum(self._outcomes)
        return failures / seen >= self.policy.failure_ratio

    def _half_open(self) -> None:
        self.state, self._probes = BreakerState.HALF_OPEN, 0
        _transition(self.name, "half-open: probing")

    def _open(self, seconds: float) -> None:
        _transition(self.name, f"open for {seconds:g}s", logging.WARNING)
        self.state = BreakerState.OPEN
        self.opened += 1
        self._open_for = seconds
        self._open_until = self._clock.now() + seconds
        self._outcomes.clear()
        self._consecutive = 0
        self._ramp = None

    def _close(self) -> None:
        _transition(self.name, "closed: the deployment answers again")
        self.state = BreakerState.CLOSED
        self._start_ramp(self._clock.now())

    def _start_ramp(self, start: float) -> None:
        if self.policy.ramp_s > 0:
            self._ramp = (start, self.policy.ramp_s * (0.8 + 0.4 * self._jitter()))


def _transition(deployment: str, what: str, level: int = logging.INFO) -> None:
    log.log(
        level,
        "circuit of deployment %s %s",
        deployment,
        what,
        extra={"repeat_key": ("circuit", deployment, what)},
    )
