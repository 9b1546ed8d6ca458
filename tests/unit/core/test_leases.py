"""The heartbeat keeps held leases alive and lets released or orphaned ones lapse."""

from __future__ import annotations

import asyncio

from sluicegate.core.leases import Leases
from sluicegate.core.limits import Ask, Lease, Slot
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock
from tests.support.fakes import YieldingStore

ONE_SLOT = Ask(slots=(Slot("s", 2),))


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


class HeldReleases(YieldingStore):
    """Releases wait until `answer` is set: a networked store's slow reply."""

    def __init__(self, inner):
        super().__init__(inner)
        self.answer = asyncio.Event()

    async def release(self, lease):
        await self.answer.wait()
        await self.inner.release(lease)


async def test_a_detached_give_back_does_not_wait_for_the_store_and_drain_finishes_it():
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    slow = HeldReleases(store)
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
    slow = HeldReleases(store)
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
