"""The heartbeat keeps held leases alive and lets released or orphaned ones lapse."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sluicegate.core.leases import Leases
from sluicegate.core.limits import (
    NO_SLOTS,
    Ask,
    Charge,
    GiveBack,
    Lease,
    Prefill,
    PrefillEnd,
    PrefillState,
    Rate,
    Refund,
    Slot,
)
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock
from tests.support.fakes import UnreachableStore, YieldingStore

ONE_SLOT = Ask(slots=(Slot("s", 2),))
PER_MINUTE_60 = Rate(limit=60, period_s=60, burst=60)


async def test_a_held_lease_outlives_many_ttls_while_an_orphaned_one_lapses():
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    ours = Leases(store, clock, ttl_s=3)
    dead_replica = Leases(store, clock, ttl_s=3)
    kept = await ours.take(ONE_SLOT)
    assert isinstance(kept, Lease)
    assert isinstance(await dead_replica.take(ONE_SLOT), Lease)
    heartbeat = asyncio.create_task(ours.run())
    try:
        for _ in range(30):
            await asyncio.sleep(0)
            clock.advance(0.5)
            await asyncio.sleep(0)
        assert await store.in_use("s") == 1
        await ours.give_back(kept)
        assert ours.held == 0
        assert await store.in_use("s") == 0
    finally:
        heartbeat.cancel()


class GrantsThenYields(YieldingStore):
    """The store grants, then the answer is slow to arrive (a networked store's reply)."""

    async def take(self, ask, lease, ttl_s):
        refused = await self.inner.take(ask, lease, ttl_s)
        await asyncio.sleep(0)
        return refused


async def test_a_lease_granted_while_its_taker_was_cancelled_is_released():
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    leases = Leases(GrantsThenYields(store), clock)
    taker = asyncio.create_task(leases.take(ONE_SLOT))
    await asyncio.sleep(0)
    taker.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert taker.cancelled()
    assert await store.in_use("s") == 0


async def test_a_give_back_cut_short_by_a_cancel_is_finished_by_the_leases():
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    leases = Leases(YieldingStore(store), clock)
    lease = await leases.take(ONE_SLOT)
    assert isinstance(lease, Lease)
    releaser = asyncio.create_task(leases.give_back(lease))
    await asyncio.sleep(0)
    releaser.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert releaser.cancelled()
    assert await store.in_use("s") == 0


class HeldGiveBacks(YieldingStore):
    """Give-backs wait until `answer` is set (a networked store's slow reply); `calls`
    records what each call carried."""

    def __init__(self, inner):
        super().__init__(inner)
        self.answer = asyncio.Event()
        self.calls: list[list[GiveBack]] = []

    async def give_back(self, backs):
        self.calls.append(list(backs))
        await self.answer.wait()
        await self.inner.give_back(backs)


async def test_a_detached_give_back_does_not_wait_for_the_store_and_drain_finishes_it():
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    slow = HeldGiveBacks(store)
    leases = Leases(slow, clock, detached=True)
    lease = await leases.take(ONE_SLOT)
    assert isinstance(lease, Lease)
    releaser = asyncio.create_task(leases.give_back(lease))
    for _ in range(3):
        await asyncio.sleep(0)
    assert releaser.done()
    assert leases.held == 0
    assert await store.in_use("s") == 1
    draining = asyncio.create_task(leases.drain(timeout_s=60))
    await asyncio.sleep(0)
    assert not draining.done()
    slow.answer.set()
    await draining
    assert await store.in_use("s") == 0


async def test_an_attached_give_back_waits_for_the_release():
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    slow = HeldGiveBacks(store)
    leases = Leases(slow, clock)
    lease = await leases.take(ONE_SLOT)
    assert isinstance(lease, Lease)
    releaser = asyncio.create_task(leases.give_back(lease))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not releaser.done()
    slow.answer.set()
    await releaser
    assert await store.in_use("s") == 0


async def test_detached_give_backs_of_one_loop_turn_leave_in_one_store_call():
    """A request's edge leases with their refunds, and another request's pool lease."""
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    slow = HeldGiveBacks(store)
    slow.answer.set()
    leases = Leases(slow, clock, detached=True)
    spent = Charge("r", PER_MINUTE_60, 30)
    tenant = await leases.take(Ask(slots=(Slot("{e}tenant", 1),)))
    shared = await leases.take(Ask(slots=(Slot("{e}route", 1),), charges=(spent,)))
    pool = await leases.take(Ask(slots=(Slot("{p}pool", 1),)))
    assert isinstance(tenant, Lease)
    assert isinstance(shared, Lease)
    assert isinstance(pool, Lease)
    await leases.give_back(shared, (Refund(spent, 20),))
    await leases.give_back(tenant)
    await leases.give_back(pool)
    await leases.drain(timeout_s=60)
    assert slow.calls == [
        [GiveBack(shared, (Refund(spent, 20),)), GiveBack(tenant), GiveBack(pool)]
    ]
    assert await store.available("r", PER_MINUTE_60) == pytest.approx(50)
    await leases.give_back(NO_SLOTS, (Refund(spent, 5),))
    await leases.drain(timeout_s=60)
    assert len(slow.calls) == 2


async def test_a_give_back_that_finds_the_store_down_does_not_fail_the_request(caplog):
    clock = FakeClock()
    for detached in (False, True):
        leases = Leases(UnreachableStore(), clock, detached=detached)
        lease = Lease("x:1", ("s",))
        with caplog.at_level(logging.WARNING, logger="sluicegate"):
            await leases.give_back(lease, (Refund(Charge("r", PER_MINUTE_60, 9), 4),))
            await leases.drain(timeout_s=60)
        assert "a refund is lost" in caplog.text
        caplog.clear()


class CountedEnds(YieldingStore):
    """Records what each prefill call carried."""

    def __init__(self, inner):
        super().__init__(inner)
        self.calls: list[list[PrefillEnd]] = []

    async def prefilled(self, ends):
        self.calls.append(list(ends))
        return await super().prefilled(ends)


async def test_prefill_ends_of_one_loop_turn_leave_in_one_call_and_each_hears_the_state():
    clock = FakeClock()
    store = CountedEnds(MemoryLimitStore(clock))
    leases = Leases(store, clock)
    prompt = Ask(slots=(Slot("s", 10),), prefill=Prefill("b", 2_000, 1.0))
    first = await leases.take(prompt)
    assert isinstance(first, Lease)
    clock.advance(0.1)
    heard: list[PrefillState] = []
    leases.prefilled(PrefillEnd("b", first.id, True), heard.append)
    leases.prefilled(PrefillEnd("b", "never-sent", False), heard.append)
    assert store.calls == []
    await leases.drain(timeout_s=60)
    assert len(store.calls) == 1
    assert len(store.calls[0]) == 2
    assert heard == [PrefillState(0, pytest.approx(20_000))] * 2


async def test_a_prefill_end_the_store_cannot_take_is_logged_not_raised(caplog):
    clock = FakeClock()
    leases = Leases(UnreachableStore(), clock)
    heard: list[PrefillState] = []
    with caplog.at_level(logging.WARNING, logger="sluicegate"):
        leases.prefilled(PrefillEnd("b", "x:1", True), heard.append)
        await leases.drain(timeout_s=60)
    assert heard == []
    assert "prefill lapses by its TTL" in caplog.text


async def test_a_prompt_counted_while_its_taker_was_cancelled_is_ended():
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    leases = Leases(GrantsThenYields(store), clock)
    prompt = Ask(slots=(Slot("s", 10),), prefill=Prefill("b", 2_000, 1.0))
    taker = asyncio.create_task(leases.take(prompt))
    await asyncio.sleep(0)
    taker.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    await leases.drain(timeout_s=60)
    assert taker.cancelled()
    assert await store.take(prompt, Lease("next", ("s",)), 30.0) is None, "nothing counted"
