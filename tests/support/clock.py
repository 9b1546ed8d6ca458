from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable


class FakeTimer:
    __slots__ = ("callback", "cancelled", "when_s")

    def __init__(self, when_s: float, callback: Callable[[], None]) -> None:
        self.when_s = when_s
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def run(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.callback()


class FakeClock:
    """A clock that moves only when told to; its timers fire, in order, as it moves."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.t

    def call_at(self, when_s: float, callback: Callable[[], None]) -> FakeTimer:
        """Like the real clock, a timer already due runs on the loop's next turn."""
        timer = FakeTimer(when_s, callback)
        if when_s <= self.t:
            asyncio.get_running_loop().call_soon(timer.run)
        else:
            heapq.heappush(self._timers, (when_s, next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self._fire()

    def pending(self) -> list[float]:
        """When the timers not yet fired nor cancelled are due, soonest first."""
        return sorted(when for when, _, timer in self._timers if not timer.cancelled)

    def _fire(self) -> None:
        timers = self._timers
        while timers and timers[0][0] <= self.t:
            heapq.heappop(timers)[2].run()
