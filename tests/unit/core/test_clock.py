"""The clocks themselves: the real one waits on the running loop, the fake one on advance."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sluicegate.core.clock import MonotonicClock, sleep_until
from tests.support.clock import FakeClock

UNIT_TESTS = Path(__file__).parents[1]


async def test_the_real_clock_fires_sub_millisecond_timers():
    """uvloop answers a short delay with a plain Handle; the dispatcher once died on it.
    Below its millisecond resolution the order among them is not kept, and need not be."""
    clock = MonotonicClock()
    fired: list[int] = []
    start = clock.now()
    for i in range(20):
        clock.call_at(start + i * 0.0002, lambda i=i: fired.append(i))
    cancelled = clock.call_at(start + 0.001, lambda: fired.append(-1))
    cancelled.cancel()
    await asyncio.sleep(0.05)
    assert sorted(fired) == list(range(20))


async def test_the_real_clock_sleeps_until_its_own_reading():
    clock = MonotonicClock()
    when = clock.now() + 0.02
    await sleep_until(clock, when)
    assert time.monotonic() >= when - 0.002


async def test_the_fake_clock_fires_timers_only_as_it_advances():
    clock = FakeClock()
    sleeper = asyncio.create_task(sleep_until(clock, clock.now() + 5))
    fired: list[str] = []
    clock.call_at(clock.now() + 1, lambda: fired.append("1s"))
    dropped = clock.call_at(clock.now() + 2, lambda: fired.append("2s"))
    dropped.cancel()
    await asyncio.sleep(0)
    clock.advance(4.9)
    await asyncio.sleep(0)
    assert fired == ["1s"]
    assert not sleeper.done()
    clock.advance(0.1)
    await asyncio.wait_for(sleeper, 1)
    assert clock.pending() == []


async def test_a_cancelled_sleep_leaves_no_timer():
    clock = FakeClock()
    sleeper = asyncio.create_task(sleep_until(clock, clock.now() + 5))
    await asyncio.sleep(0)
    sleeper.cancel()
    await asyncio.gather(sleeper, return_exceptions=True)
    assert clock.pending() == []


def test_unit_tests_run_on_one_fake_clock():
    """A unit test whose subject runs on a fake clock must not build its calls from the
    real one: only this file, which tests the real clock, may construct it."""
    offenders = [
        str(path.relative_to(UNIT_TESTS))
        for path in UNIT_TESTS.rglob("*.py")
        if path != Path(__file__) and "MonotonicClock(" in path.read_text()
    ]
    assert offenders == []
