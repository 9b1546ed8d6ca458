"""One contract for every `LimitStore`: the in-memory store, the same behind a wrapper
that yields on every call as a networked store does, and the Redis store (on the
machine's Redis, under a key prefix of each test's own, with the test's clock passed
to its scripts in place of the server's)."""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator, Callable

import pytest

from sluicegate.capacity.pools import Pool, PoolGroup
from sluicegate.core.leases import Leases
from sluicegate.core.limits import (
    NO_SLOTS,
    Ask,
    Charge,
    GiveBack,
    Lease,
    LimitStore,
    Part,
    Rate,
    Refund,
    Refused,
    Slot,
)
from sluicegate.core.types import PoolSpec
from sluicegate.stores.memory import MemoryLimitStore
from sluicegate.stores.redis import RedisLimitStore
from sluicegate.stores.resp import RespConnection
from tests.support.clock import FakeClock
from tests.support.fakes import YieldingStore
from tests.support.redis import REDIS_URL, redis_or_skip

PER_MINUTE_60 = Rate(limit=60, period_s=60, burst=60)
TTL_S = 30.0

STORES: dict[str, Callable[[FakeClock], LimitStore]] = {
    "memory": MemoryLimitStore,
    "yielding": lambda clock: YieldingStore(MemoryLimitStore(clock)),
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=[*sorted(STORES), "redis"])
async def store(request, clock) -> AsyncIterator[LimitStore]:
    if request.param != "redis":
        yield STORES[request.param](clock)
        return
    async with redis_or_skip() as (_, prefix):
        yield RedisLimitStore(RespConnection(REDIS_URL, 5.0), prefix, 5.0, clock=clock)


_ids = itertools.count(1)


async def take(store: LimitStore, ask: Ask) -> Lease | Refused:
    """The lease taken under a fresh id, or the refusal."""
    lease = Lease(f"test:{next(_ids)}", tuple(slot.key for slot in ask.slots))
    refused = await store.take(ask, lease, TTL_S)
    return lease if refused is None else refused


def charge(cost: float, key: str = "k", rate: Rate = PER_MINUTE_60) -> Ask:
    return Ask(charges=(Charge(key, rate, cost),))


def slots(*limits: tuple[str, int]) -> Ask:
    return Ask(slots=tuple(Slot(key, limit) for key, limit in limits))


async def test_gcra_allows_the_burst_then_refuses_with_the_time_to_the_next_slot(store, clock):
    for _ in range(60):
        assert isinstance(await take(store, charge(1)), Lease)
    refused = await take(store, charge(1))
    assert refused == Refused(Part.CHARGE, 0, pytest.approx(1.0))
    clock.advance(1.0)
    assert isinstance(await take(store, charge(1)), Lease)


async def test_a_cost_counts_units_and_one_above_the_burst_never_passes(store):
    assert isinstance(await take(store, charge(50)), Lease)
    refused = await take(store, charge(20))
    assert isinstance(refused, Refused)
    assert refused.retry_after_s == pytest.approx(10.0)
    never = await take(store, charge(61, key="other"))
    assert isinstance(never, Refused)
    assert math.isinf(never.retry_after_s or 0)


async def test_refund_gives_back_units_and_idle_time_is_not_banked(store, clock):
    await take(store, charge(60))
    assert await store.available("k", PER_MINUTE_60) == pytest.approx(0)
    await store.give_back([GiveBack(NO_SLOTS, (Refund(Charge("k", PER_MINUTE_60, 60), 40),))])
    assert await store.available("k", PER_MINUTE_60) == pytest.approx(40)
    await store.give_back([GiveBack(NO_SLOTS, (Refund(Charge("k", PER_MINUTE_60, 60), -20),))])
    assert await store.available("k", PER_MINUTE_60) == pytest.approx(20)
    clock.advance(3600)
    assert await store.available("k", PER_MINUTE_60) == pytest.approx(60)


async def test_a_refusal_writes_nothing(store):
    """The last part refuses: the slot is not held and the first charge not spent."""
    await take(store, slots(("s", 1)))
    ask = Ask(
        slots=(Slot("t", 1),),
        charges=(Charge("a", PER_MINUTE_60, 10), Charge("b", PER_MINUTE_60, 61)),
    )
    assert await take(store, ask) == Refused(Part.CHARGE, 1, math.inf)
    assert await store.in_use("t") == 0
    assert await store.available("a", PER_MINUTE_60) == pytest.approx(60)
    full = Ask(slots=(Slot("t", 1), Slot("s", 1)), charges=(Charge("a", PER_MINUTE_60, 10),))
    assert await take(store, full) == Refused(Part.SLOT, 1, None)
    assert await store.in_use("t") == 0
    assert await store.available("a", PER_MINUTE_60) == pytest.approx(60)


async def test_slots_are_leases_released_once_whatever_is_called(store):
    first = await take(store, slots(("s", 2), ("t", 5)))
    second = await take(store, slots(("s", 2)))
    assert isinstance(first, Lease)
    assert isinstance(second, Lease)
    assert await take(store, slots(("s", 2))) == Refused(Part.SLOT, 0, None)
    await store.give_back([GiveBack(first)])
    await store.give_back([GiveBack(first)])
    assert (await store.in_use("s"), await store.in_use("t")) == (1, 0)
    await store.give_back([GiveBack(second)])
    assert await store.in_use("s") == 0


async def test_a_give_back_frees_the_lease_and_refunds_its_charges_once(store):
    """Given back twice (a call made again after a lost answer), the refund applies once."""
    spent = Charge("r", PER_MINUTE_60, 50)
    lease = await take(store, Ask(slots=(Slot("s", 1),), charges=(spent,)))
    assert isinstance(lease, Lease)
    back = GiveBack(lease, (Refund(spent, 30),))
    await store.give_back([back])
    await store.give_back([back])
    assert await store.in_use("s") == 0
    assert await store.available("r", PER_MINUTE_60) == pytest.approx(40)


async def test_a_lapsed_lease_given_back_refunds_nothing(store, clock):
    """Its slot came free when it lapsed; its reservation stands."""
    spent = Charge("r", PER_MINUTE_60, 50)
    lease = await take(store, Ask(slots=(Slot("s", 1),), charges=(spent,)))
    assert isinstance(lease, Lease)
    clock.advance(TTL_S + 1)
    await store.give_back([GiveBack(lease, (Refund(spent, 30),))])
    assert await store.available("r", PER_MINUTE_60) == pytest.approx(60 - 50 + 31)


async def test_several_give_backs_in_one_call_each_apply_in_full(store):
    """A request's leases (and other requests') handed back together, charges refunded
    and charged more at once."""
    tokens = Charge("{e}tokens", PER_MINUTE_60, 40)
    tenant = await take(store, slots(("{e}tenant", 1)))
    shared = await take(store, Ask(slots=(Slot("{e}route", 1),), charges=(tokens,)))
    pool_tokens = Charge("{p}tokens", PER_MINUTE_60, 20)
    pool = await take(store, Ask(slots=(Slot("{p}pool", 1),), charges=(pool_tokens,)))
    assert isinstance(tenant, Lease)
    assert isinstance(shared, Lease)
    assert isinstance(pool, Lease)
    await store.give_back(
        [
            GiveBack(tenant),
            GiveBack(shared, (Refund(tokens, 30),)),
            GiveBack(pool, (Refund(pool_tokens, -5),)),
            GiveBack(NO_SLOTS, (Refund(tokens, 10),)),
        ]
    )
    for key in ("{e}tenant", "{e}route", "{p}pool"):
        assert await store.in_use(key) == 0
    assert await store.available("{e}tokens", PER_MINUTE_60) == pytest.approx(60)
    assert await store.available("{p}tokens", PER_MINUTE_60) == pytest.approx(35)


async def test_a_lease_not_renewed_lapses_and_its_slot_is_free_again(store, clock):
    """A replica that died (SIGKILL) stops renewing: its slots come free by themselves."""
    kept = await take(store, slots(("s", 2)))
    lost = await take(store, slots(("s", 2)))
    assert isinstance(kept, Lease)
    assert isinstance(lost, Lease)
    for _ in range(9):
        clock.advance(TTL_S / 3)
        await store.renew([kept], TTL_S)
    assert await store.in_use("s") == 1
    assert isinstance(await take(store, slots(("s", 2))), Lease)


async def test_a_lapsed_lease_is_not_brought_back_by_a_late_renewal(store, clock):
    lease = await take(store, slots(("s", 1)))
    assert isinstance(lease, Lease)
    clock.advance(TTL_S + 1)
    await store.renew([lease], TTL_S)
    assert await store.in_use("s") == 0


async def test_a_cooldown_refuses_with_its_end_and_is_extended_never_shortened(store, clock):
    await store.cool("c", 10)
    await store.cool("c", 2)
    ask = Ask(cooldowns=("c",), slots=(Slot("s", 1),))
    assert await take(store, ask) == Refused(Part.COOLDOWN, 0, pytest.approx(10))
    assert await store.in_use("s") == 0
    clock.advance(10)
    assert isinstance(await take(store, ask), Lease)


async def test_a_pool_decision_with_spare_slots_leaves_them_free(store, clock):
    """The dispatcher's reserve lowers the pool's limit in the one decision, so any store
    (Redis across a fleet too) keeps the spare slots free of work beyond its share."""
    group = PoolGroup([Pool(PoolSpec(f"reserve{next(_ids)}", 4), Leases(store, clock))])
    held = [await group.acquire(10) for _ in range(2)]
    refused = await group.acquire(10, spare=2)
    assert getattr(refused, "code", None) == "pool_concurrency_limited"
    held.append(await group.acquire(10, spare=1))
    held.append(await group.acquire(10))
    assert all(not hasattr(permit, "code") for permit in held)
    assert getattr(await group.acquire(10), "code", None) == "pool_concurrency_limited"
    for permit in held:
        await permit.release(10)


async def test_a_slot_of_no_places_refuses_even_when_empty(store):
    refused = await take(store, slots(("nothing", 0)))
    assert refused == Refused(Part.SLOT, 0, None)
