"""The fleet's circuit state machine as the Redis store runs it (`lua/breaker.lua`), on
a test clock: failures seen by two replicas trip it together, one probe for the fleet,
a failed probe doubles the open time, a probe holder that vanished hands it on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sluicegate.core.types import BreakerPolicy
from sluicegate.stores.redis import RedisLimitStore
from tests.support.clock import FakeClock
from tests.support.redis import store_on_clock

POLICY = BreakerPolicy(consecutive_failures=4, window=10, min_attempts=10, open_s=5.0)
NOTHING = (0, 0, 0, None)


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[RedisLimitStore, FakeClock]]:
    async with store_on_clock() as found:
        yield found


async def test_failures_seen_by_two_replicas_open_the_circuit_for_both(fleet):
    store, _ = fleet
    assert await store.sync_breaker("d", "a", (0, 2, 2, None), POLICY) == ("closed", 0.0, False)
    state, reopens_in, _ = await store.sync_breaker("d", "b", (0, 2, 2, None), POLICY)
    assert (state, reopens_in) == ("open", pytest.approx(5.0))
    state, _, _ = await store.sync_breaker("d", "a", NOTHING, POLICY)
    assert state == "open"


async def test_a_success_ends_the_run_of_failures_and_the_ratio_needs_min_attempts(fleet):
    store, _ = fleet
    await store.sync_breaker("d", "a", (0, 3, 3, None), POLICY)
    assert (await store.sync_breaker("d", "b", (1, 1, 1, None), POLICY))[0] == "closed"
    assert (await store.sync_breaker("d", "a", (4, 0, 0, None), POLICY))[0] == "closed"
    assert (await store.sync_breaker("d", "a", (0, 1, 1, None), POLICY))[0] == "open"


async def test_one_probe_for_the_fleet_and_its_success_closes_for_everyone(fleet):
    store, clock = fleet
    await store.sync_breaker("d", "a", (0, 4, 4, None), POLICY)
    clock.advance(5.0)
    assert await store.sync_breaker("d", "b", NOTHING, POLICY) == ("half_open", 0.0, True)
    assert await store.sync_breaker("d", "a", NOTHING, POLICY) == ("half_open", 0.0, False)
    assert (await store.sync_breaker("d", "a", (0, 0, 0, True), POLICY))[0] == "half_open"
    assert (await store.sync_breaker("d", "b", (0, 0, 0, True), POLICY))[0] == "closed"
    assert (await store.sync_breaker("d", "a", NOTHING, POLICY))[0] == "closed"


async def test_a_failed_probe_doubles_the_open_time(fleet):
    store, clock = fleet
    await store.sync_breaker("d", "a", (0, 4, 4, None), POLICY)
    clock.advance(5.0)
    await store.sync_breaker("d", "a", NOTHING, POLICY)
    state, reopens_in, _ = await store.sync_breaker("d", "a", (0, 0, 0, False), POLICY)
    assert (state, reopens_in) == ("open", pytest.approx(10.0))


async def test_a_probe_holder_that_went_silent_hands_the_probe_on(fleet):
    store, clock = fleet
    await store.sync_breaker("d", "a", (0, 4, 4, None), POLICY)
    clock.advance(5.0)
    assert (await store.sync_breaker("d", "a", NOTHING, POLICY))[2]
    clock.advance(4.0)
    assert not (await store.sync_breaker("d", "b", NOTHING, POLICY))[2]
    clock.advance(1.0)
    assert await store.sync_breaker("d", "b", NOTHING, POLICY) == ("half_open", 0.0, True)
