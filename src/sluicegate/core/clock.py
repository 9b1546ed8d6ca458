"""A monotonic clock that policy code receives instead of reading or waiting on time itself.

Waiting goes through the clock too (`call_at`, `sleep_until`), so a test's fake clock
drives expiry, pacing and wake-ups exactly as it drives `now()`: one clock per test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale; only differences are meaningful."""
        ...

    def call_at(self, when_s: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` once `now()` has reached `when_s` (at once if it has)."""
        ...


class MonotonicClock:
    """The process's monotonic clock, waiting on the running event loop.

    Delays are taken from this clock's own reading rather than the loop's `time()`,
    which uvloop reads from its own cached source.
    """

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when_s: float, callback: Callable[[], None]) -> Timer:
        delay = max(0.0, when_s - time.monotonic())
        return asyncio.get_running_loop().call_later(delay, callback)


class Wakeup:
    """One pending call of `callback`, at the earliest of the times asked for: asked for
    a later time while one is pending, nothing changes; for a sooner one, it moves."""

    __slots__ = ("_callback", "_clock", "_pending")

    def __init__(self, clock: Clock, callback: Callable[[], None]) -> None:
        self._clock = clock
        self._callback = callback
        self._pending: tuple[float, Timer] | None = None

    def in_s(self, delay_s: float) -> None:
        when = self._clock.now() + delay_s
        pending = self._pending
        if pending is not None:
            if pending[0] <= when:
                return
            pending[1].cancel()
        self._pending = (when, self._clock.call_at(when, self._due))

    def _due(self) -> None:
        self._pending = None
        self._callback()


async def sleep_until(clock: Clock, when_s: float) -> None:
    """Wait until `clock` reads `when_s`; cancelling the wait cancels its timer."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    timer = clock.call_at(when_s, wake)
    try:
        await future
    finally:
        timer.cancel()


def timeout_at(clock: Clock, when_s: float | None) -> Deadline:
    """`asyncio.timeout` driven by `clock`: the block raises TimeoutError once the clock
    reads `when_s` (None: no limit)."""
    return Deadline(clock, when_s)


class Deadline:
    """What `timeout_at` returns: a class, not a generator, since every upstream attempt
    enters one."""

    __slots__ = ("_clock", "_scope", "_timer", "_when_s")

    def __init__(self, clock: Clock, when_s: float | None) -> None:
        self._clock = clock
        self._when_s = when_s
        self._scope = asyncio.timeout(None)
        self._timer: Timer | None = None

    async def __aenter__(self) -> None:
        await self._scope.__aenter__()
        if self._when_s is not None:
            self._timer = self._clock.call_at(self._when_s, self._expire)

    def _expire(self) -> None:
        self._scope.reschedule(asyncio.get_running_loop().time())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        if self._timer is not None:
            self._timer.cancel()
        return await self._scope.__aexit__(exc_type, exc, traceback)


async def repeat(clock: Clock, every_s: float, step: Callable[[], Awaitable[None]]) -> None:
    """Run `step`, then again `every_s` after each run ended, for the caller's lifetime."""
    while True:
        await step()
        await sleep_until(clock, clock.now() + every_s)
