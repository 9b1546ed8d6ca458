"""The fleet's fair-share state as the Redis store keeps it (`lua/fair.lua`), on a test
clock: charges from every replica add up, a flow that starts waiting is lifted to the
least waiting counter, flows leave when idle or when their replica stops saying so."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sluicegate.stores.redis import RedisLimitStore
from tests.support.clock import FakeClock
from tests.support.redis import store_on_clock

TTL_S = 0.3


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[RedisLimitStore, FakeClock]]:
    async with store_on_clock() as found:
        yield found


async def test_charges_from_every_replica_add_up_for_the_flows_waiting(fleet):
    store, _ = fleet
    assert await store.sync_fairness("m:l", "r1", {"a": 10.0}, ["a"], [], TTL_S) == {"a": 10.0}
    seen = await store.sync_fairness("m:l", "r2", {"a": 5.0, "b": 2.0}, ["b"], [], TTL_S)
    assert seen == {"a": 15.0, "b": 15.0}, "b joined while a waited: lifted to a's counter"


async def test_a_flow_that_starts_waiting_is_lifted_only_to_the_least_waiting_counter(fleet):
    store, _ = fleet
    await store.sync_fairness("m:l", "r1", {"a": 100.0, "b": 40.0}, ["a", "b"], [], TTL_S)
    await store.sync_fairness("m:l", "r1", {}, ["a"], ["b"], TTL_S)
    seen = await store.sync_fairness("m:l", "r2", {}, ["c", "b"], [], TTL_S)
    assert seen == {"a": 100.0, "b": 100.0, "c": 100.0}


async def test_a_flow_leaves_when_idle_everywhere_or_when_its_replica_goes_silent(fleet):
    store, clock = fleet
    await store.sync_fairness("m:l", "r1", {}, ["a"], [], TTL_S)
    await store.sync_fairness("m:l", "r2", {}, ["a", "b"], [], TTL_S)
    assert set(await store.sync_fairness("m:l", "r1", {}, [], ["a"], TTL_S)) == {"a", "b"}
    clock.advance(TTL_S + 0.1)
    assert await store.sync_fairness("m:l", "r1", {}, [], [], TTL_S) == {}
