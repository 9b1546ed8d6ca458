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


async def counters(store: RedisLimitStore, replica: str, charged, waiting, idle):
    """The counters a sync of lane `m:l` answers, with no request held here."""
    found, _ = await store.sync_fairness("m:l", replica, charged, waiting, idle, TTL_S, {})
    return found


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[RedisLimitStore, FakeClock]]:
    async with store_on_clock() as found:
        yield found


async def test_charges_from_every_replica_add_up_for_the_flows_waiting(fleet):
    store, _ = fleet
    assert await counters(store, "r1", {"a": 10.0}, ["a"], []) == {"a": 10.0}
    seen = await counters(store, "r2", {"a": 5.0, "b": 2.0}, ["b"], [])
    assert seen == {"a": 15.0, "b": 15.0}, "b joined while a waited: lifted to a's counter"


async def test_a_flow_that_starts_waiting_is_lifted_only_to_the_least_waiting_counter(fleet):
    store, _ = fleet
    await counters(store, "r1", {"a": 100.0, "b": 40.0}, ["a", "b"], [])
    await counters(store, "r1", {}, ["a"], ["b"])
    seen = await counters(store, "r2", {}, ["c", "b"], [])
    assert seen == {"a": 100.0, "b": 100.0, "c": 100.0}


async def test_a_flow_leaves_when_idle_everywhere_or_when_its_replica_goes_silent(fleet):
    store, clock = fleet
    await counters(store, "r1", {}, ["a"], [])
    await counters(store, "r2", {}, ["a", "b"], [])
    assert set(await counters(store, "r1", {}, [], ["a"])) == {"a", "b"}
    clock.advance(TTL_S + 0.1)
    assert await counters(store, "r1", {}, [], []) == {}


async def test_each_replica_learns_what_the_others_hold(fleet):
    """r1 says a holds 3 there (in flight or queued), r2 says a 1 and b 2: each learns
    the others' counts, a replica's new word replaces its old one, and a silent
    replica's counts expire."""
    store, clock = fleet
    _, seen = await store.sync_fairness("m:l", "r1", {}, [], [], TTL_S, {"a": 3})
    assert seen == {}
    _, seen = await store.sync_fairness("m:l", "r2", {}, [], [], TTL_S, {"a": 1, "b": 2})
    assert seen == {"a": 3}
    _, seen = await store.sync_fairness("m:l", "r1", {}, [], [], TTL_S, {"b": 1})
    assert seen == {"a": 1, "b": 2}
    clock.advance(TTL_S + 0.1)
    _, seen = await store.sync_fairness("m:l", "r1", {}, [], [], TTL_S, {"b": 1})
    assert seen == {}
