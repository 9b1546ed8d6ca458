from __future__ import annotations

import pytest

from sluicegate.capacity.pools import Pool, PoolGroup, PoolPermit
from sluicegate.core.errors import GatewayError
from sluicegate.core.leases import Leases
from sluicegate.core.limits import Ask, Lease, Part, Rate, Refused, Slot
from sluicegate.core.types import PoolSpec
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock


async def take(pools: list[Pool], tokens: int) -> PoolPermit:
    permit = await PoolGroup(pools).acquire(tokens)
    assert isinstance(permit, PoolPermit), permit
    return permit


async def refused(pools: list[Pool], tokens: int) -> GatewayError:
    refusal = await PoolGroup(pools).acquire(tokens)
    assert isinstance(refusal, GatewayError), refusal
    return refusal


def pool(clock=None, **limits) -> Pool:
    spec = PoolSpec("p", limits.pop("max_concurrency", 2), **limits)
    clock = clock or FakeClock()
    return Pool(spec, Leases(MemoryLimitStore(clock), clock))


async def test_concurrency_is_immediate_or_refuse_without_retry_after():
    p = pool()
    held = [await take([p], 0), await take([p], 0)]
    info = await refused([p], 0)
    assert (info.status, info.code) == (503, "pool_concurrency_limited")
    assert info.retry_after_s is None
    await held[0].release(None)
    assert p.counters.active == 1
    await take([p], 0)


async def test_release_is_idempotent():
    p = pool(max_concurrency=1)
    permit = await take([p], 0)
    await permit.release(None)
    await permit.release(None)
    assert p.counters.active == 0
    await take([p], 0)
    await refused([p], 0)


async def test_a_1000_token_reservation_that_used_10_gives_990_back():
    p = pool(tokens=Rate(100_000, 60, 100_000))
    permit = await take([p], 1000)
    assert await p.available_tokens() == pytest.approx(99_000)
    await permit.release(10)
    assert await p.available_tokens() == pytest.approx(99_990)
    assert (p.counters.tokens_reserved, p.counters.tokens_used) == (1000, 10)


async def test_unknown_usage_keeps_the_whole_reservation():
    p = pool(tokens=Rate(100_000, 60, 100_000))
    permit = await take([p], 1000)
    await permit.release(None)
    assert await p.available_tokens() == pytest.approx(99_000)
    assert p.counters.tokens_unsettled == 1000


async def test_token_refusal_frees_the_slot_and_the_request_unit():
    p = pool(max_concurrency=1, requests=Rate(1, 60, 1), tokens=Rate(100, 60, 100))
    info = await refused([p], 500)
    assert info.code == "pool_token_limited"
    assert info.should_retry is False
    assert p.counters.active == 0
    permit = await take([p], 50)
    await permit.release(50)


async def test_request_rate_refusal_carries_the_window():
    p = pool(max_concurrency=5, requests=Rate(2, 60, 2))
    await take([p], 0)
    await take([p], 0)
    info = await refused([p], 0)
    assert info.code == "pool_rate_limited"
    assert info.retry_after_s == pytest.approx(30)
    assert p.counters.active == 2


async def test_cooldown_refuses_with_its_end():
    clock = FakeClock()
    p = pool(clock)
    await p.cool(12)
    clock.advance(2)
    info = await refused([p], 0)
    assert (info.code, info.retry_after_s) == ("pool_cooling_down", pytest.approx(10))
    clock.advance(10)
    await take([p], 0)


async def test_release_listeners_are_told():
    p = pool()
    told: list[int] = []
    p.on_release(lambda: told.append(p.counters.active))
    permit = await take([p], 0)
    await permit.release(None)
    assert told == [0]


class SetAsideElsewhere(MemoryLimitStore):
    """A shared store whose one slot is free but set aside for another replica's waiter
    for `lapse_s` (as `RedisLimitStore` answers then)."""

    def __init__(self, clock: FakeClock, lapse_s: float) -> None:
        super().__init__(clock)
        self.lapse_s = lapse_s

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        return Refused(Part.SLOT, 0, self.lapse_s)


async def test_waiters_look_again_when_a_slot_set_aside_elsewhere_lapses():
    """The other replica may never come for it; nobody else would announce the slot. The
    lapse is no Retry-After: a concurrency limit guesses none (MISSION 1.3)."""
    clock = FakeClock()
    p = Pool(PoolSpec("p", 1), Leases(SetAsideElsewhere(clock, 0.25), clock))
    told: list[float] = []
    p.on_release(lambda: told.append(clock.now()))
    info = await refused([p], 0)
    assert (info.code, info.retry_after_s) == ("pool_concurrency_limited", None)
    clock.advance(0.1)
    await refused([p], 0)
    clock.advance(0.14)
    assert told == []
    clock.advance(0.01)
    assert told == [pytest.approx(1000.25)]
    clock.advance(1.0)
    assert told == [pytest.approx(1000.25)]


async def test_a_sooner_time_to_look_again_replaces_a_later_one():
    """A refusal that may lift sooner (a prompt's due time, a set-aside about to lapse)
    moves the wake-up earlier; waiters are told once, then."""
    clock = FakeClock()
    store = SetAsideElsewhere(clock, 0.25)
    p = Pool(PoolSpec("p", 1), Leases(store, clock))
    told: list[float] = []
    p.on_release(lambda: told.append(clock.now()))
    await refused([p], 0)
    clock.advance(0.1)
    store.lapse_s = 0.05
    await refused([p], 0)
    clock.advance(0.04)
    assert told == []
    clock.advance(0.02)
    clock.advance(1.0)
    assert told == [pytest.approx(1000.16)]


async def test_a_deployment_behind_two_pools_takes_both_or_neither():
    clock = FakeClock()
    leases = Leases(MemoryLimitStore(clock), clock)
    p = Pool(PoolSpec("p", 2), leases)
    q = Pool(PoolSpec("q", 1, tokens=Rate(100, 60, 100)), leases)
    held = await take([p, q], 10)
    info = await refused([p, q], 10)
    assert info.message == "pool q is at its concurrency limit"
    assert (p.counters.active, q.counters.active) == (1, 1)
    assert await leases.store.in_use(p.slot.key) == 1
    await held.release(4)
    assert await q.available_tokens() == pytest.approx(96)
    assert (p.counters.active, q.counters.active) == (0, 0)
    assert leases.held == 0


async def test_the_fleets_backend_bound_is_one_more_slot_of_the_decision():
    """Taken and freed with the pools' slots; when it is full the answer is backend_busy
    and no pool slot is held."""
    p = pool(max_concurrency=5)
    group = PoolGroup([p])
    backend = Slot("{pools}backend:d", 1)
    first = await group.acquire(0, backend)
    assert isinstance(first, PoolPermit)
    second = await group.acquire(0, backend)
    assert isinstance(second, GatewayError)
    assert (second.status, second.code) == (503, "backend_busy")
    assert await p.leases.store.in_use(p.slot.key) == 1
    await first.release(None)
    assert await p.leases.store.in_use("{pools}backend:d") == 0
    assert isinstance(await group.acquire(0, backend), PoolPermit)


async def test_the_view_shows_how_long_the_cooldown_this_process_set_still_runs():
    clock = FakeClock()
    p = pool(clock)
    assert p.view().cooldown_s == 0.0
    await p.cool(5.0)
    await p.cool(2.0)  # a shorter one never shortens it
    clock.advance(1.5)
    assert p.view().cooldown_s == 3.5
    clock.advance(4.0)
    assert p.view().cooldown_s == 0.0
