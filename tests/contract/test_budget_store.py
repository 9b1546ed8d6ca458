"""One suite for every `BudgetStore`: one process's memory and Redis."""

from collections.abc import AsyncIterator

import pytest

from sluicegate.core.limits import StoreUnavailable
from sluicegate.core.spend import BudgetStore, Line, Unbuilt
from sluicegate.stores.budget_memory import MemoryBudgetStore
from sluicegate.stores.budgets import RedisBudgetStore
from sluicegate.stores.resp import RespConnection
from tests.support.redis import REDIS_URL, redis_or_skip

EXPIRE_AT = 4_102_444_800.0
A = Line("spend:acme|*|daily|2026-12-07", 100, EXPIRE_AT)
B = Line("spend:acme|big|daily|2026-12-07", 50, EXPIRE_AT)


@pytest.fixture(params=["memory", "redis"])
async def store(request) -> AsyncIterator[BudgetStore]:
    if request.param == "memory":
        yield MemoryBudgetStore()
        return
    async with redis_or_skip() as (_, prefix):
        redis = RedisBudgetStore(RespConnection(REDIS_URL, 5.0), prefix, 5.0)
        try:
            await redis.rebuild({})
            yield redis
        finally:
            await redis.close()


async def test_a_reservation_fits_every_line_or_takes_nothing(store):
    first = await store.reserve((A, B), 40)
    assert (first.refused, first.totals) == (None, (40, 40))
    refused = await store.reserve((A, B), 20)
    assert (refused.refused, refused.totals) == (1, (40, 40))
    assert (await store.reserve((A,), 60)).totals == (100,)
    assert (await store.reserve((A,), 1)).refused == 0


async def test_settling_counts_the_spend_in_place_of_the_reservation(store):
    held = await store.reserve((A, B), 40)
    assert await store.settle((A, B), 40, 25, held.epoch) == (25, 25)
    assert await store.settle((A, B), 0, 30, held.epoch) == (55, 55)


async def test_a_settle_may_pass_the_limit_since_the_provider_billed_it(store):
    held = await store.reserve((B,), 50)
    assert await store.settle((B,), 50, 70, held.epoch) == (70,)
    assert (await store.reserve((B,), 1)).refused == 0


async def test_redis_loses_its_counters_and_is_unbuilt_until_rebuilt():
    async with redis_or_skip() as (client, prefix):
        store = RedisBudgetStore(RespConnection(REDIS_URL, 5.0), prefix, 5.0)
        try:
            with pytest.raises(Unbuilt):
                await store.reserve((A,), 1)
            assert await store.rebuild({A: 30})
            held = await store.reserve((A,), 10)
            assert held.totals == (40,)
            assert not await store.rebuild({A: 0}), "built once per loss"
            keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
            await client.delete(*keys)
            with pytest.raises(Unbuilt):
                await store.settle((A,), 10, 4, held.epoch)
            assert await store.rebuild({A: 30})
            # Its reservation went with the old counters: the whole spend is counted.
            assert await store.settle((A,), 10, 4, held.epoch) == (34,)
        finally:
            await store.close()


async def test_an_unreachable_redis_is_unavailable():
    store = RedisBudgetStore(RespConnection("redis://127.0.0.1:9", 0.5), "x:", 0.5)
    try:
        with pytest.raises(StoreUnavailable):
            await store.reserve((A,), 1)
    finally:
        await store.close()
