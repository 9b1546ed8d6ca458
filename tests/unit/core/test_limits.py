from __future__ import annotations

import math

import pytest

from sluicegate.core.limits import Rate
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock

PER_MINUTE_60 = Rate(limit=60, period_s=60, burst=60)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock) -> MemoryLimitStore:
    return MemoryLimitStore(clock)


async def test_gcra_allows_the_burst_then_refuses_with_the_time_to_the_next_slot(store, clock):
    for _ in range(60):
        assert (await store.consume("k", PER_MINUTE_60, 1)).allowed
    refused = await store.consume("k", PER_MINUTE_60, 1)
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(1.0)
    clock.advance(1.0)
    assert (await store.consume("k", PER_MINUTE_60, 1)).allowed


async def test_gcra_cost_counts_units_not_requests(store, clock):
    assert (await store.consume("k", PER_MINUTE_60, 50)).allowed
    refused = await store.consume("k", PER_MINUTE_60, 20)
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(10.0)


async def test_cost_above_the_burst_can_never_pass(store):
    decision = await store.consume("k", PER_MINUTE_60, 61)
    assert not decision.allowed
    assert math.isinf(decision.retry_after_s)


async def test_refund_gives_back_unused_units_and_idle_time_is_not_banked(store, clock):
    assert (await store.consume("k", PER_MINUTE_60, 60)).allowed
    assert await store.available("k", PER_MINUTE_60) == pytest.approx(0)
    await store.refund("k", PER_MINUTE_60, 40)
    assert await store.available("k", PER_MINUTE_60) == pytest.approx(40)
    clock.advance(3600)
    assert await store.available("k", PER_MINUTE_60) == pytest.approx(60)


async def test_negative_refund_charges_usage_beyond_the_reservation(store):
    await store.consume("k", PER_MINUTE_60, 10)
    await store.refund("k", PER_MINUTE_60, -20)
    assert await store.available("k", PER_MINUTE_60) == pytest.approx(30)


async def test_slots_are_counted_and_over_release_is_an_error(store):
    assert await store.acquire("s", 2)
    assert await store.acquire("s", 2)
    assert not await store.acquire("s", 2)
    await store.release("s")
    assert await store.in_use("s") == 1
    await store.release("s")
    with pytest.raises(RuntimeError):
        await store.release("s")


async def test_cooldown_extends_but_never_shortens(store, clock):
    await store.cool("c", 10)
    await store.cool("c", 2)
    assert await store.cooldown_left("c") == pytest.approx(10)
    clock.advance(10)
    assert await store.cooldown_left("c") == 0
