"""The dispatcher with real pools, a gate the test controls and a fake clock: every wait
and wake-up is driven by `clock.advance`, never by sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from sluicegate.capacity.breaker import Breaker
from sluicegate.capacity.gates import GateState
from sluicegate.capacity.pools import Pool
from sluicegate.core import keys
from sluicegate.core.call import Call
from sluicegate.core.errors import GatewayError
from sluicegate.core.leases import Leases
from sluicegate.core.limits import Ask, Lease, Refused
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import (
    BreakerPolicy,
    Deployment,
    Endpoint,
    Lane,
    Mechanism,
    Model,
    PoolSpec,
    RoutePolicy,
    Tenant,
    Timeouts,
)
from sluicegate.observability.collectors import CapacityCollector
from sluicegate.scheduling.attempt import Attempt, Outcome, Target
from sluicegate.scheduling.demand import SMOOTHING
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.fairness import RoundRobin, VirtualTokenCounter
from sluicegate.scheduling.handover import Giver
from sluicegate.scheduling.placement import fallback, round_robin
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock
from tests.support.fakes import YieldingStore

INTERACTIVE = Lane("interactive", priority=100, queue_size=100, max_queue_age_s=5)
GUARDED = dataclasses.replace(INTERACTIVE, ttft_slo_s=60.0)
"""The interactive lane with a promise no test here comes near: a reserve is kept only
for a lane that promises a first token."""
HEAVY = Lane("heavy", priority=50, queue_size=100, max_queue_age_s=5, starvation_s=0.05)
BACKGROUND = Lane("background", priority=0, queue_size=100, max_queue_age_s=5, max_share=0.5)
SHORT = Lane("short", priority=100, queue_size=10, max_queue_age_s=0.05)
DEPLOYMENT = Deployment("d", "openai", "http://x/v1", "m", None, Timeouts(1, 1, 1), 8, ("p",))
RESUMABLE = dataclasses.replace(DEPLOYMENT, resumable=True)


class Gate:
    """A backend gate the test opens and closes by hand."""

    def __init__(self) -> None:
        self.open_for: set[str] | None = None
        self.tpot_s: float | None = None
        self._listeners: list[Callable[[], None]] = []

    def admits(self, lane: Lane) -> bool:
        return self.open_for is None or lane.name in self.open_for

    def fleet_slot(self, lane: Lane) -> None:
        return None

    def sent(self) -> None: ...

    def withdraw(self) -> None: ...

    def done(self, first_byte_s: float | None) -> None: ...

    def state(self) -> GateState:
        return GateState.OPEN

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def set(self, open_for: set[str] | None) -> None:
        self.open_for = open_for
        for listener in self._listeners:
            listener()


def leases(clock: FakeClock) -> Leases:
    return Leases(MemoryLimitStore(clock), clock)


def dispatcher_for(
    lanes: list[Lane],
    pool: Pool,
    clock: FakeClock,
    gate: Gate | None = None,
    deployment: Deployment = DEPLOYMENT,
    **options,
):
    """One deployment behind `pool`, VTC fairness, on the test's clock."""
    target = Target(deployment, (pool,), gate or Gate(), Breaker(BreakerPolicy(), clock))
    return Dispatcher("m", lanes, [target], lambda lane: VirtualTokenCounter(), clock, **options)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def setup(clock):
    pool = Pool(PoolSpec("p", 1), leases(clock))
    gate = Gate()
    dispatcher = dispatcher_for([INTERACTIVE, HEAVY, BACKGROUND, SHORT], pool, clock, gate)
    runner = asyncio.create_task(dispatcher.run())
    yield dispatcher, pool, gate
    runner.cancel()


def call(clock: FakeClock, tenant="a", lane=INTERACTIVE, deadline_in_s=10.0) -> Call:
    """A request that arrives now by `clock`, the clock its dispatcher runs on."""
    now = clock.now()
    return Call(
        Endpoint.CHAT,
        Tenant(tenant, None),
        Model("m", (DEPLOYMENT,)),
        RoutePolicy(),
        lane,
        {},
        False,
        now,
        now + deadline_in_s,
        10,
        20,
    )


def attempt(clock: FakeClock, *args, **kwargs) -> Attempt:
    return Attempt(call(clock, *args, **kwargs))


async def granted(dispatcher: Dispatcher, a: Attempt) -> Attempt:
    await dispatcher.acquire(a)
    return a


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def serve_in_turn(
    dispatcher: Dispatcher, clock: FakeClock, waiting: list[tuple[str, Call]]
) -> list[str]:
    """With the only permit held, queue `waiting` in order, then release one grant at a
    time and return the labels in the order they were dispatched."""
    grant = await granted(dispatcher, attempt(clock))
    tasks = {}
    for label, c in waiting:
        tasks[asyncio.create_task(granted(dispatcher, Attempt(c)))] = (label, c)
        await settle()
    order: list[str] = []
    while tasks:
        await dispatcher.release(grant)
        done, _ = await asyncio.wait(tasks, timeout=1, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        task = done.pop()
        label, _ = tasks.pop(task)
        order.append(label)
        grant = task.result()
    await dispatcher.release(grant)
    return order


async def test_an_idle_system_dispatches_at_once_and_release_frees_the_pool(setup, clock):
    dispatcher, pool, _ = setup
    grant = await granted(dispatcher, attempt(clock))
    assert pool.counters.active == 1
    assert grant.dispatched_s is not None
    await dispatcher.release(grant)
    assert pool.counters.active == 0


async def test_with_every_queue_empty_a_release_does_not_wake_the_pump(clock):
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock)
    grant = await granted(dispatcher, attempt(clock))
    await dispatcher.release(grant)
    assert not dispatcher._kicked.is_set()
    grant = await granted(dispatcher, attempt(clock))
    waiter = asyncio.create_task(granted(dispatcher, attempt(clock)))
    await settle()
    assert dispatcher._kicked.is_set()  # someone waits: the pump must look
    waiter.cancel()
    await dispatcher.release(grant)


async def test_a_lane_without_a_queue_refuses_at_once(clock):
    now = Lane("now", priority=100)
    dispatcher = dispatcher_for([now], Pool(PoolSpec("p", 1), leases(clock)), clock)
    grant = await granted(dispatcher, attempt(clock, lane=now))
    with pytest.raises(GatewayError) as info:
        await granted(dispatcher, attempt(clock, lane=now))
    assert info.value.code == "pool_concurrency_limited"
    await dispatcher.release(grant)


async def test_a_release_wakes_the_next_waiter(setup, clock):
    dispatcher, pool, _ = setup
    grant = await granted(dispatcher, attempt(clock))
    waiter = asyncio.create_task(granted(dispatcher, attempt(clock)))
    await settle()
    assert not waiter.done()
    await dispatcher.release(grant)
    second = await asyncio.wait_for(waiter, 1)
    assert pool.counters.active == 1
    assert second.lane is INTERACTIVE


async def test_lanes_are_served_by_priority(setup, clock):
    dispatcher, _, _ = setup
    waiting = [("background", call(clock, lane=BACKGROUND)), ("interactive", call(clock))]
    assert await serve_in_turn(dispatcher, clock, waiting) == ["interactive", "background"]


async def test_a_late_tenant_is_served_before_an_earlier_backlog_drains(setup, clock):
    dispatcher, _, _ = setup
    waiting = [("a", call(clock, "a")) for _ in range(5)] + [("b", call(clock, "b"))]
    order = await serve_in_turn(dispatcher, clock, waiting)
    assert order.index("b") <= 1


async def test_queued_work_expires_without_being_dispatched(setup, clock):
    dispatcher, pool, _ = setup
    grant = await granted(dispatcher, attempt(clock))
    aged = asyncio.create_task(granted(dispatcher, attempt(clock, lane=SHORT)))
    late = asyncio.create_task(granted(dispatcher, attempt(clock, deadline_in_s=0.1)))
    await settle()
    assert not aged.done()
    clock.advance(0.05)
    await settle()
    assert not late.done()
    clock.advance(0.05)
    for task, expected in ((aged, (503, "expired")), (late, (504, "deadline_exceeded"))):
        with pytest.raises(GatewayError) as info:
            await task
        assert (info.value.status, info.value.code) == expected
    assert all(q.size == 0 for q in dispatcher.queues.values())
    await dispatcher.release(grant)
    assert pool.counters.active == 0


async def test_only_dispatches_after_a_wait_in_the_queue_count_as_from_it(setup, clock):
    """The holder went at once; of three queued behind it one is dispatched when it ends
    and two expire: the lane dispatched two, one from its queue, and two expired."""
    dispatcher, _, _ = setup
    holder = await granted(dispatcher, attempt(clock))
    queued = [asyncio.create_task(granted(dispatcher, attempt(clock))) for _ in range(3)]
    try:
        await settle()
        await dispatcher.release(holder)
        await settle()
        clock.advance(INTERACTIVE.max_queue_age_s)
        await settle()
        assert [task.exception() is None for task in queued] == [True, False, False]
        lane = dispatcher.view().lanes[0]
        assert (lane.dispatched, lane.queue_dispatched, lane.expired) == (2, 1, 2)
    finally:
        for task in queued:
            task.cancel()
        if queued[0].done() and queued[0].exception() is None:
            await dispatcher.release(queued[0].result())


async def test_a_caller_that_leaves_is_never_dispatched(setup, clock):
    dispatcher, pool, _ = setup
    grant = await granted(dispatcher, attempt(clock))
    waiter = asyncio.create_task(granted(dispatcher, attempt(clock)))
    await settle()
    waiter.cancel()
    await settle()
    assert dispatcher.queues["interactive"].size == 0
    await dispatcher.release(grant)
    await settle()
    assert pool.counters.active == 0
    lane = dispatcher.view().lanes[0]
    assert (lane.dispatched, lane.abandoned, lane.unavailable) == (1, 1, 0)


async def test_the_backend_gate_holds_a_lane_until_it_opens(setup, clock):
    dispatcher, _, gate = setup
    gate.set({"interactive"})
    waiter = asyncio.create_task(granted(dispatcher, attempt(clock, lane=BACKGROUND)))
    await settle()
    assert not waiter.done()
    gate.set(None)
    grant = await asyncio.wait_for(waiter, 1)
    assert grant.lane is BACKGROUND


async def test_a_lane_share_reserves_the_rest_of_the_pool(clock):
    pool = Pool(PoolSpec("p", 4), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE, BACKGROUND], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        await busy_top(dispatcher, clock, INTERACTIVE)
        grants = [await granted(dispatcher, attempt(clock, lane=BACKGROUND)) for _ in range(2)]
        third = asyncio.create_task(granted(dispatcher, attempt(clock, lane=BACKGROUND)))
        await settle()
        assert not third.done()
        grants += [await granted(dispatcher, attempt(clock)) for _ in range(2)]
        assert pool.counters.active == 4
        third.cancel()
    finally:
        runner.cancel()


async def test_a_starving_lane_goes_before_higher_ones(setup, clock):
    dispatcher, _, _ = setup
    grant = await granted(dispatcher, attempt(clock))
    heavy = asyncio.create_task(granted(dispatcher, attempt(clock, lane=HEAVY)))
    await settle()
    clock.advance(0.08)
    interactive = asyncio.create_task(granted(dispatcher, attempt(clock)))
    await settle()
    await dispatcher.release(grant)
    await asyncio.wait_for(heavy, 1)
    await settle()
    assert not interactive.done()
    interactive.cancel()


@pytest.mark.parametrize(("ttft_slo_s", "age_s"), [(1.0, 5.0), (10.0, 1.0)])
async def test_a_lane_whose_expected_wait_breaks_its_promise_refuses(
    setup, clock, ttft_slo_s, age_s
):
    """Predicted wait 2 s (three ahead and its own turn, 0.5 s each): beyond the TTFT
    promise, or beyond the queue's age limit."""
    dispatcher, _, _ = setup
    promised = Lane(
        "promised", priority=100, queue_size=100, max_queue_age_s=age_s, ttft_slo_s=ttft_slo_s
    )
    dispatcher.queues["promised"] = dispatcher.queues["interactive"]
    grant = await granted(dispatcher, attempt(clock))
    waiters = [asyncio.create_task(granted(dispatcher, attempt(clock))) for _ in range(3)]
    await settle()
    dispatcher.rule.predictor.gap_s = 0.5
    asked = asyncio.create_task(granted(dispatcher, attempt(clock, lane=promised)))
    await settle()
    assert asked.done(), "refused at once, not queued"
    with pytest.raises(GatewayError) as info:
        asked.result()
    assert (info.value.status, info.value.code) == (503, "overloaded")
    for waiter in waiters:
        waiter.cancel()
    await dispatcher.release(grant)


async def test_a_paused_lane_waits_until_unpaused(clock):
    pool = Pool(PoolSpec("p", 4), leases(clock))
    paused = {"background"}
    dispatcher = dispatcher_for(
        [INTERACTIVE, BACKGROUND], pool, clock, paused=lambda lane: lane.name in paused
    )
    runner = asyncio.create_task(dispatcher.run())
    try:
        waiter = asyncio.create_task(granted(dispatcher, attempt(clock, lane=BACKGROUND)))
        await granted(dispatcher, attempt(clock))
        await settle()
        assert not waiter.done()
        paused.clear()
        dispatcher.kick()
        await asyncio.wait_for(waiter, 1)
    finally:
        runner.cancel()


@pytest.mark.parametrize(("rate", "count"), [(20, 4), (2000, 40)])
async def test_a_paced_lane_spreads_its_dispatches(clock, rate, count):
    """Sub-millisecond spacing too: a fast-paced lane once stopped the dispatcher for good."""
    pool = Pool(PoolSpec("p", 50), leases(clock))
    paced = Lane("paced", queue_size=50, max_queue_age_s=5, max_dispatch_rate=rate)
    dispatcher = dispatcher_for([paced], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        started = clock.now()
        calls = [attempt(clock, lane=paced) for _ in range(count)]
        acquired = asyncio.gather(*(dispatcher.acquire(c) for c in calls))
        step = 0.1 / rate
        for _ in range(20 * count):
            await settle()
            if acquired.done():
                break
            clock.advance(step)
        await acquired
        times = sorted(c.dispatched_s - started for c in calls)
    finally:
        runner.cancel()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= 1 / rate - step for gap in gaps), times
    assert times[-1] <= (count - 1) * (1 / rate + step) + step, times


@pytest.mark.parametrize(("age_s", "queued"), [(1.0, False), (30.0, True)])
async def test_a_known_wait_longer_than_the_queue_allows_is_answered_at_once(clock, age_s, queued):
    """An open circuit names its reopening time: a request that could not wait that long
    gets 503 circuit_open with Retry-After now, rather than waiting to expire."""
    lane = Lane("default", queue_size=10, max_queue_age_s=age_s)
    pool = Pool(PoolSpec("p", 4), leases(clock))
    dispatcher = dispatcher_for([lane], pool, clock)
    breaker = dispatcher.targets[0].breaker
    for _ in range(breaker.policy.consecutive_failures):
        breaker.started()
        breaker.record(False)
    task = asyncio.create_task(granted(dispatcher, attempt(clock, lane=lane, deadline_in_s=60)))
    await settle()
    assert task.done() != queued
    if not queued:
        err = task.exception()
        assert isinstance(err, GatewayError)
        assert err.code == "circuit_open"
        policy = breaker.policy
        assert policy.open_s <= (err.retry_after_s or 0) <= policy.open_s + policy.ramp_s
    task.cancel()


async def test_a_queued_request_is_answered_when_a_circuit_opens_for_longer_than_it_may_wait(
    clock,
):
    lane = Lane("default", queue_size=10, max_queue_age_s=1)
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([lane], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        await granted(dispatcher, attempt(clock, lane=lane))
        waiting = asyncio.create_task(granted(dispatcher, attempt(clock, lane=lane)))
        await settle()
        assert not waiting.done()
        breaker = dispatcher.targets[0].breaker
        for _ in range(breaker.policy.consecutive_failures):
            breaker.started()
            breaker.record(False)
        dispatcher.kick()
        await settle()
        assert waiting.done()
        err = waiting.exception()
        assert isinstance(err, GatewayError)
        assert err.code == "circuit_open"
        view = dispatcher.view().lanes[0]
        assert (view.unavailable, view.abandoned, view.expired) == (1, 0, 0)
    finally:
        runner.cancel()


async def test_before_any_measure_a_promised_lane_queues_one_batch(clock):
    """Two slots, nothing measured yet: two may queue behind them, the third is refused
    at once rather than promised on no evidence."""
    pool = Pool(PoolSpec("p", 2), leases(clock))
    promised = Lane("promised", queue_size=10, max_queue_age_s=5, ttft_slo_s=1.0)
    dispatcher = dispatcher_for([promised], pool, clock)
    grants = [await granted(dispatcher, attempt(clock, lane=promised)) for _ in range(2)]
    queued = [
        asyncio.create_task(granted(dispatcher, attempt(clock, lane=promised))) for _ in range(2)
    ]
    await settle()
    assert not any(task.done() for task in queued)
    with pytest.raises(GatewayError) as info:
        await granted(dispatcher, attempt(clock, lane=promised))
    assert (info.value.code, info.value.retry_after_s) == ("overloaded", None)
    for task in queued:
        task.cancel()
    for grant in grants:
        await dispatcher.release(grant)


@pytest.mark.parametrize(("retries", "refused"), [(0, False), (1, True)])
async def test_announced_retries_do_not_count_against_a_first_attempts_promise(
    clock, retries, refused
):
    """Three retries queued at 0.5 s per dispatch: 2 s with its own turn, beyond a 1 s
    promise, for a newcomer that queues behind them (a retry), not for one that goes
    before them. (Three slots held: before any measure a batch of three may queue.)"""
    pool = Pool(PoolSpec("p", 3), leases(clock))
    lane = Lane("promised", queue_size=10, max_queue_age_s=5, ttft_slo_s=1.0)
    dispatcher = dispatcher_for([lane], pool, clock)
    grants = [await granted(dispatcher, attempt(clock, lane=lane)) for _ in range(3)]
    queued = [
        asyncio.create_task(
            dispatcher.acquire(Attempt(call(clock, lane=lane)._replace(client_retries=1)))
        )
        for _ in range(3)
    ]
    await settle()
    dispatcher.rule.predictor.gap_s = 0.5
    newcomer = asyncio.create_task(
        dispatcher.acquire(Attempt(call(clock, lane=lane)._replace(client_retries=retries)))
    )
    await settle()
    assert newcomer.done() == refused
    if refused:
        assert isinstance(newcomer.exception(), GatewayError)
    for task in [*queued, newcomer]:
        task.cancel()
    for grant in grants:
        await dispatcher.release(grant)


@pytest.mark.parametrize(("hedge", "within_share"), [(False, 1), (True, 0)])
async def test_a_hedge_is_not_judged_within_its_share_again(clock, hedge, within_share):
    """The second attempt of a hedged pair is its request again, judged when it came."""
    pool = Pool(PoolSpec("p", 2), leases(clock))
    lane = Lane("promised", queue_size=10, max_queue_age_s=5, ttft_slo_s=1.0)
    dispatcher = dispatcher_for([lane], pool, clock)
    grant = await granted(dispatcher, Attempt(call(clock, lane=lane), hedge=hedge))
    assert dispatcher.view().protected_arrivals == within_share
    await dispatcher.release(grant)


async def test_a_waiter_cancelled_as_it_is_granted_leaves_every_count_at_zero(clock):
    """The pump grants a waiter whose caller was cancelled in the same loop turn: it must
    undo only what it did (the permits), never the dispatch it did not record."""
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE, BACKGROUND], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        holder = await granted(dispatcher, attempt(clock))
        waiter = asyncio.create_task(granted(dispatcher, attempt(clock, lane=BACKGROUND)))
        await settle()
        await dispatcher.release(holder)
        waiter.cancel()
        await settle()
        assert waiter.cancelled()
        target = dispatcher.targets[0]
        assert target.breaker.in_flight == 0
        assert pool.counters.active == 0
        assert all(stats.in_flight == 0 for stats in dispatcher.stats.lanes.values())
        assert dispatcher.view().checks["lane_share"]["in_use"] == {}
        assert not runner.done()
        again = await granted(dispatcher, attempt(clock, lane=BACKGROUND))
        await dispatcher.release(again)
    finally:
        runner.cancel()


def two_pools(clock: FakeClock, limit: int = 4) -> tuple[Dispatcher, list[Pool], MemoryLimitStore]:
    """One deployment behind two pools, on a store that yields on every call."""
    memory = MemoryLimitStore(clock)
    shared = Leases(YieldingStore(memory), clock)
    pools = [Pool(PoolSpec(name, limit), shared) for name in ("p", "q")]
    deployment = dataclasses.replace(DEPLOYMENT, pools=("p", "q"))
    target = Target(deployment, tuple(pools), Gate(), Breaker(BreakerPolicy(), clock))
    lanes = [Lane("half", queue_size=0, max_share=0.5), Lane("top", priority=100)]
    dispatcher = Dispatcher("m", lanes, [target], lambda lane: VirtualTokenCounter(), clock)
    return dispatcher, pools, memory


async def busy_top(dispatcher: Dispatcher, clock: FakeClock, lane: Lane) -> None:
    """One request of `lane` arrives and ends: the lanes below hold to their share."""
    await dispatcher.release(await granted(dispatcher, attempt(clock, tenant="top", lane=lane)))


@pytest.mark.parametrize("turns", range(1, 8))
async def test_a_cancel_anywhere_inside_pool_acquisition_leaks_no_permit(clock, turns):
    dispatcher, pools, memory = two_pools(clock)
    a = attempt(clock, lane=dispatcher.lanes[1])
    task = asyncio.create_task(dispatcher.acquire(a))
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    await settle()
    await settle()
    if not task.cancelled():
        await dispatcher.release(a)
    assert [pool.counters.active for pool in pools] == [0, 0]
    assert [await memory.in_use(pool.slot.key) for pool in pools] == [0, 0]
    assert dispatcher.targets[0].breaker.in_flight == 0


async def test_a_lane_share_holds_when_the_store_yields(clock):
    """Four attempts at once against a share of two: the check and the count it guards
    are one step, so no more than two pass while the store is being asked."""
    dispatcher, pools, _ = two_pools(clock)
    top, lane = dispatcher.lanes
    await busy_top(dispatcher, clock, top)
    attempts = [attempt(clock, lane=lane) for _ in range(4)]
    outcomes = await asyncio.gather(
        *(dispatcher.acquire(a) for a in attempts), return_exceptions=True
    )
    admitted = [a for a, outcome in zip(attempts, outcomes, strict=True) if outcome is None]
    assert len(admitted) == 2
    assert [pool.counters.active for pool in pools] == [2, 2]
    for a in admitted:
        await dispatcher.release(a)
    assert [pool.counters.active for pool in pools] == [0, 0]


async def test_the_fair_share_is_corrected_with_the_completion_the_provider_reported(clock):
    """The prompt was estimated at 10 tokens but really took 95: the tenant is charged
    the 5 tokens it was generated, not the 90 that total minus estimate would say."""
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock)
    a = await granted(dispatcher, attempt(clock))
    a.used_tokens, a.completion_tokens = 100, 5
    a.outcome = Outcome.OK
    await dispatcher.release(a)
    expected = VirtualTokenCounter()
    expected.charge("a", 10, 5)
    assert dispatcher.queues["interactive"].fairness.service() == expected.service()


def reserving(dispatcher: Dispatcher, slots: int) -> None:
    """Protected arrivals at 2/s and a completion every 0.5 s: load 1, so the reserve
    is as large as it may be (a quarter of the batch)."""
    for _ in range(40):
        dispatcher.spares.reserve.arrived(dispatcher.clock.now())
    dispatcher.rule.predictor.gap_s = 0.5
    assert dispatcher.spares.reserve.slots(dispatcher.clock.now(), 0.5) == slots


async def big_backlog_beside_small(
    dispatcher: Dispatcher, clock: FakeClock, lane: Lane = GUARDED
) -> tuple[list[Attempt], list[asyncio.Task[Attempt]]]:
    """On a pool of 8: `small` holds 1 and `big` 6, one of big's 7 having ended, with 3
    more of big's queued beyond its share."""
    held = [await granted(dispatcher, attempt(clock, tenant="small", lane=lane))]
    held += [await granted(dispatcher, attempt(clock, tenant="big", lane=lane)) for _ in range(7)]
    backlog = [
        asyncio.create_task(granted(dispatcher, attempt(clock, tenant="big", lane=lane)))
        for _ in range(3)
    ]
    await settle()
    await dispatcher.release(held.pop())
    await settle()
    return held, backlog


@pytest.mark.parametrize("reserve", [True, False])
async def test_work_beyond_its_share_leaves_the_reserve_to_a_tenant_within_its_own(clock, reserve):
    """`small` holds 1 of 8 and `big` the rest, with 3 more queued. When one of big's
    ends, big (beyond its half, with a backlog) may not take the slot while only the
    reserve's 2 are free; `small`'s next request then goes at once. Without the reserve
    big's backlog would take the slot and small would queue behind it."""
    pool = Pool(PoolSpec("p", 8), leases(clock))
    dispatcher = dispatcher_for([GUARDED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        if reserve:
            reserving(dispatcher, 2)
        _, backlog = await big_backlog_beside_small(dispatcher, clock)
        assert sum(task.done() for task in backlog) == (0 if reserve else 1)
        small = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="small", lane=GUARDED))
        )
        await settle()
        assert small.done() is reserve
        for task in (*backlog, small):
            task.cancel()
    finally:
        runner.cancel()


async def test_no_reserve_is_kept_in_a_lane_that_promises_no_first_token(clock):
    """The traffic above in a lane without `ttft_slo_s`: nothing is promised, so no slot
    is kept free, and big's backlog takes the slot that frees."""
    pool = Pool(PoolSpec("p", 8), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        reserving(dispatcher, 0)
        _, backlog = await big_backlog_beside_small(dispatcher, clock, INTERACTIVE)
        assert sum(task.done() for task in backlog) == 1
        for task in backlog:
            task.cancel()
    finally:
        runner.cancel()


async def test_a_lower_lane_never_takes_the_reserve(clock):
    pool = Pool(PoolSpec("p", 8), leases(clock))
    dispatcher = dispatcher_for([GUARDED, HEAVY], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        reserving(dispatcher, 2)
        for _ in range(6):
            await granted(dispatcher, attempt(clock, tenant="batch", lane=HEAVY))
        heavy = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="x", lane=HEAVY)))
        await settle()
        assert not heavy.done()
        await granted(dispatcher, attempt(clock, tenant="x", lane=GUARDED))
        assert pool.counters.active == 7
        heavy.cancel()
    finally:
        runner.cancel()


async def test_a_lane_share_lends_the_pool_while_the_lanes_above_are_quiet(clock):
    """Work conservation: with no arrival above for the reserve's 30 s, the background
    lane uses the whole pool; once the lane above is busy again it is held to its half.
    At the start the lanes above count as busy: a batch submitted first would otherwise
    take the whole pool from the first interactive requests."""
    pool = Pool(PoolSpec("p", 4), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE, BACKGROUND], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        early = [await granted(dispatcher, attempt(clock, lane=BACKGROUND)) for _ in range(2)]
        capped = asyncio.create_task(granted(dispatcher, attempt(clock, lane=BACKGROUND)))
        await settle()
        assert not capped.done()
        capped.cancel()
        for grant in early:
            await dispatcher.release(grant)
        clock.advance(31.0)
        grants = [await granted(dispatcher, attempt(clock, lane=BACKGROUND)) for _ in range(3)]
        for grant in grants:
            await dispatcher.release(grant)
        await busy_top(dispatcher, clock, INTERACTIVE)
        clock.advance(29.0)
        grants = [await granted(dispatcher, attempt(clock, lane=BACKGROUND)) for _ in range(2)]
        third = asyncio.create_task(granted(dispatcher, attempt(clock, lane=BACKGROUND)))
        await settle()
        assert not third.done()
        clock.advance(2.0)
        dispatcher.kick()
        await settle()
        assert third.done()
        assert pool.counters.active == 3
        for grant in [*grants, third.result()]:
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_a_request_within_its_share_passes_a_backlog_beyond_theirs(clock):
    """`small` holds 1 of 8 and `big` 7, with 3 more queued beyond its share. Round robin
    would visit big's backlog first, but with one slot free and a reserve of two it may
    not take it: small's next request (within its share) is dispatched at once, not
    queued behind that backlog, and once the pool is full again a queued one of small's
    goes before big's when a slot frees."""
    pool = Pool(PoolSpec("p", 8), leases(clock))
    target = Target(DEPLOYMENT, (pool,), Gate(), Breaker(BreakerPolicy(), clock))
    dispatcher = Dispatcher("m", [GUARDED], [target], lambda lane: RoundRobin(), clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        reserving(dispatcher, 2)
        held, backlog = await big_backlog_beside_small(dispatcher, clock)
        assert not any(task.done() for task in backlog)
        passing = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="small", lane=GUARDED))
        )
        await settle()
        assert passing.done()
        held.append(passing.result())
        queued = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="small", lane=GUARDED))
        )
        await settle()
        assert not queued.done()
        await dispatcher.release(held.pop(1))
        await settle()
        assert queued.done()
        assert not any(task.done() for task in backlog)
        for task in (*backlog, passing, queued):
            task.cancel()
    finally:
        runner.cancel()


PROMISED = Lane("promised", priority=100, queue_size=100, max_queue_age_s=10, ttft_slo_s=2.0)
LOWER = Lane("lower", priority=50, queue_size=100, max_queue_age_s=5, ttft_slo_s=2.0)
"""A lane below `INTERACTIVE` that promises 2 s: its streams are paused only within that."""


async def learn_engine_unit(dispatcher: Dispatcher, clock: FakeClock, tenant: str) -> None:
    """One stream of `tenant` teaches the engine's unit: its first token 0.1 s after its
    dispatch (the prefill budget's rate: 0.1 s a prompt of 10), then ten more tokens in
    1 s alone (0.1 s each)."""
    learning = Attempt(call(clock, tenant=tenant, lane=PROMISED)._replace(stream=True))
    await granted(dispatcher, learning)
    clock.advance(0.1)
    learning.first_byte_s = clock.now()
    dispatcher.first_token(learning, 0.1)
    await settle()
    clock.advance(1.0)
    learning.completion_tokens = 11
    await dispatcher.release(learning)
    await settle()
    assert dispatcher.view().decode_s_per_token == pytest.approx(0.1)


async def test_a_streams_decode_is_its_span_less_what_the_engine_prefilled_meanwhile(clock):
    """Learnt: 0.1 s an output token. A stream streams 11 tokens alone over 2.5 s, and
    two prompts of 10 tokens got their first tokens meanwhile: 2 prompt tokens a step.
    Too few streams to read the marginal price from, so a prompt token is priced at
    the budget's rate as heard: the decode cost moves a tenth of the way from 0.1 to
    the stream's 0.25 s a step less 2 prompt tokens at that price (by its span alone,
    0.115; counting its own prompt too, less)."""
    pool = Pool(PoolSpec("p", 4), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        await learn_engine_unit(dispatcher, clock, "learner")
        stream, *others = (
            Attempt(call(clock, tenant=tenant, lane=PROMISED)._replace(stream=True))
            for tenant in ("a", "b", "c")
        )
        await granted(dispatcher, stream)
        clock.advance(0.5)
        stream.first_byte_s = clock.now()
        dispatcher.first_token(stream, 0.5)
        await settle()
        for other in others:
            await granted(dispatcher, other)
        clock.advance(0.5)
        for other in others:
            other.first_byte_s = clock.now()
            dispatcher.first_token(other, 0.5)
            await dispatcher.release(other)
        clock.advance(2.0)
        rate = dispatcher.view().targets[0].prefill_tokens_per_s
        assert rate is not None
        stream.completion_tokens = 11
        await dispatcher.release(stream)
        learnt = 0.1 + SMOOTHING * (0.25 - 0.1) - SMOOTHING * 2 / rate
        assert dispatcher.view().decode_s_per_token == pytest.approx(learnt)
        assert dispatcher.view().prefill_s_per_token is None
    finally:
        runner.cancel()


async def test_a_stream_whose_first_token_was_not_counted_teaches_the_unit_nothing(clock):
    """A stream ends whose first token the dispatcher never heard: which prompts were
    prefilled over its span is not known, and nothing is learnt from it."""
    dispatcher = dispatcher_for([PROMISED], Pool(PoolSpec("p", 4), leases(clock)), clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        unheard = Attempt(call(clock, tenant="a", lane=PROMISED)._replace(stream=True))
        await granted(dispatcher, unheard)
        unheard.first_byte_s = clock.now()
        clock.advance(1.0)
        unheard.completion_tokens = 11
        await dispatcher.release(unheard)
        assert dispatcher.view().decode_s_per_token is None
    finally:
        runner.cancel()


@pytest.mark.parametrize(("lane", "learnt"), [(PROMISED, 0.1), (INTERACTIVE, None)])
async def test_the_engines_unit_is_learnt_only_beside_a_prefill_budget(clock, lane, learnt):
    """The stream `learn_engine_unit` sends, in a lane with a promise and in one without:
    without a promise there is no prefill budget, no price is learnt, and a work estimate
    needs one, so nothing is learnt at all."""
    dispatcher = dispatcher_for([lane], Pool(PoolSpec("p", 4), leases(clock)), clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        stream = Attempt(call(clock, lane=lane)._replace(stream=True))
        await granted(dispatcher, stream)
        clock.advance(0.1)
        stream.first_byte_s = clock.now()
        dispatcher.first_token(stream, 0.1)
        clock.advance(1.0)
        stream.completion_tokens = 11
        await dispatcher.release(stream)
        if learnt is None:
            assert dispatcher.view().decode_s_per_token is None
        else:
            assert dispatcher.view().decode_s_per_token == pytest.approx(learnt)
    finally:
        runner.cancel()


async def test_a_light_tenant_within_its_share_goes_before_a_burst_within_its_own(clock):
    """The engine's unit is learnt from one stream of light's. On a full pool of 4,
    `burst` (nothing in flight) queues two requests within its share and one beyond;
    `light` (one in flight) then queues one within its own. When a slot frees, light's
    goes: it asked 2.2 s of the engine lately against burst's 3.3. By requests in flight
    (the fair order alone) burst's would go first."""
    pool = Pool(PoolSpec("p", 4), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        await learn_engine_unit(dispatcher, clock, "light")
        clock.advance(5.0)
        held = [await granted(dispatcher, attempt(clock, tenant="light", lane=PROMISED))]
        held += [await granted(dispatcher, attempt(clock, tenant="filler", lane=PROMISED))]
        held += [await granted(dispatcher, attempt(clock, tenant="filler", lane=PROMISED))]
        held += [await granted(dispatcher, attempt(clock, tenant="filler", lane=PROMISED))]
        burst = [
            asyncio.create_task(granted(dispatcher, attempt(clock, tenant="burst", lane=PROMISED)))
            for _ in range(3)
        ]
        await settle()
        light = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="light", lane=PROMISED))
        )
        await settle()
        assert dispatcher.queues["promised"].within_share == 3
        await dispatcher.release(held.pop())
        await settle()
        assert light.done()
        assert not any(task.done() for task in burst)
        for task in (*burst, light):
            task.cancel()
    finally:
        runner.cancel()


async def test_the_requests_judged_within_their_share_are_followed_to_their_end(clock):
    """On a full pool of 2 held by `big`, a lane of one queued request: `mid`'s request
    is within its share and queues; `small`'s, within its share too, is refused (the
    queue is full), and so is big's third, beyond its share. Only small's refusal
    counts as a protected request's (big's first two came within their share too), and
    mid's wait is reported as protected when a slot frees, big's next, queued beyond its
    share, as not. Later a protected request that expires in the queue counts as
    refused; one whose caller leaves does not."""
    lane = Lane("one", priority=100, queue_size=1, max_queue_age_s=5)
    pool = Pool(PoolSpec("p", 2), leases(clock))
    waits: list[tuple[float, bool]] = []
    dispatcher = dispatcher_for(
        [lane],
        pool,
        clock,
        on_wait=lambda model, name, wait_s, _, within_share: waits.append((wait_s, within_share)),
    )
    runner = asyncio.create_task(dispatcher.run())
    try:
        held = [await granted(dispatcher, attempt(clock, tenant="big", lane=lane)) for _ in "ab"]
        first = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="mid", lane=lane)))
        await settle()
        for tenant in ("small", "big"):
            with pytest.raises(GatewayError) as refused:
                await granted(dispatcher, attempt(clock, tenant=tenant, lane=lane))
            assert refused.value.code == Refusal.QUEUE_FULL
        view = dispatcher.view()
        refused = {Refusal.QUEUE_FULL: 1}
        assert (view.protected_arrivals, view.protected_refused) == (4, refused), "big's 1st two"
        clock.advance(0.5)
        await dispatcher.release(held.pop())
        held.append(await first)
        beyond = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="big", lane=lane)))
        await settle()
        clock.advance(0.25)
        await dispatcher.release(held.pop())
        await beyond
        assert waits == [(0.0, True), (0.0, True), (0.5, True), (0.25, False)]
        late = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="late", lane=lane)))
        await settle()
        clock.advance(lane.max_queue_age_s)
        with pytest.raises(GatewayError, match="limit"):
            await late
        leaves = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="other", lane=lane)))
        await settle()
        leaves.cancel()
        await settle()
        view = dispatcher.view()
        refused = {Refusal.QUEUE_FULL: 1, Refusal.EXPIRED: 1}
        assert (view.protected_arrivals, view.protected_refused) == (6, refused), "not left"
        exposed = {
            sample.labels["reason"]: sample.value
            for family in CapacityCollector([], [dispatcher], {}).collect()
            if family.name == "sluicegate_protected_refused"
            for sample in family.samples
        }
        assert exposed == refused
    finally:
        runner.cancel()


async def test_a_retry_its_caller_announces_never_takes_the_reserve(clock):
    """`small` is within its share, but this request is its caller's second attempt:
    its demand was judged when it first came, so it waits behind the reserve."""
    pool = Pool(PoolSpec("p", 8), leases(clock))
    dispatcher = dispatcher_for([GUARDED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        reserving(dispatcher, 2)
        held = [
            await granted(dispatcher, attempt(clock, tenant="big", lane=GUARDED)) for _ in range(6)
        ]
        retry = Attempt(call(clock, tenant="small", lane=GUARDED)._replace(client_retries=1))
        waiting = asyncio.create_task(granted(dispatcher, retry))
        await settle()
        assert not waiting.done()
        fresh = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="small", lane=GUARDED))
        )
        await settle()
        assert fresh.done()
        for task in (waiting, fresh):
            task.cancel()
        for grant in held:
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_of_the_requests_within_their_share_the_fair_order_serves_first(clock):
    """`a` (3 in flight) and then `b` (none) each queue a request within its share while
    the pool is full: the freed slot goes to b, whose tenant holds the least, not to the
    request that waited longer."""
    pool = Pool(PoolSpec("p", 8), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        held = [await granted(dispatcher, attempt(clock, tenant="c")) for _ in range(5)]
        held += [await granted(dispatcher, attempt(clock, tenant="a")) for _ in range(3)]
        first = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="a")))
        await settle()
        clock.advance(0.1)
        second = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        assert dispatcher.queues["interactive"].within_share == 2
        await dispatcher.release(held.pop(0))
        await settle()
        assert (first.done(), second.done()) == (False, True)
        for task in (first, second):
            task.cancel()
    finally:
        runner.cancel()


async def test_a_burst_judged_while_the_store_answers_sees_its_own_earlier_requests(clock):
    """On a store that yields, a burst of 8 beside `other`'s 4 comes within its share for
    its first 4 only: each request counts as its tenant's the moment it asks the pools,
    before the store answers, so the next one's verdict sees it."""
    pool = Pool(PoolSpec("p", 8), Leases(YieldingStore(MemoryLimitStore(clock)), clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        held = [await granted(dispatcher, attempt(clock, tenant="other")) for _ in range(4)]
        before = dispatcher.spares.reserve.arrivals
        burst = [
            asyncio.create_task(granted(dispatcher, attempt(clock, tenant="burst")))
            for _ in range(8)
        ]
        await settle()
        await settle()
        assert dispatcher.spares.reserve.arrivals - before == 4
        for task in burst:
            task.cancel()
        for grant in held:
            await dispatcher.release(grant)
    finally:
        runner.cancel()


def deployments_a_and_b(store: MemoryLimitStore, clock: FakeClock, size: int) -> list[Target]:
    """Deployments `a` and `b`, each behind its own pool of `size` on `store`."""
    targets = []
    for name in ("a", "b"):
        pool = Pool(PoolSpec(name, size), Leases(store, clock))
        deployment = dataclasses.replace(DEPLOYMENT, name=name, pools=(name,))
        targets.append(Target(deployment, (pool,), Gate(), Breaker(BreakerPolicy(), clock)))
    return targets


async def test_the_reserve_is_split_between_deployments_by_their_capacity(clock):
    """Two deployments of 4 and a reserve of 2: each keeps one free, so work beyond its
    share gets 6 of the 8 slots (taking 2 from each pool would leave it 4)."""
    targets = deployments_a_and_b(MemoryLimitStore(clock), clock, 4)
    bulk = Lane("bulk")
    lanes = [GUARDED, bulk]
    dispatcher = Dispatcher("m", lanes, targets, lambda lane: VirtualTokenCounter(), clock)
    reserving(dispatcher, 2)
    held = []
    for _ in range(8):
        a = attempt(clock, tenant="batch", lane=bulk)
        try:
            held.append(await granted(dispatcher, a))
        except GatewayError:
            break
    assert len(held) == 6
    for grant in held:
        await dispatcher.release(grant)


class QueuedAsks(MemoryLimitStore):
    """Records, per ask, its slots' keys and whether its asker said it waits for them."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.asks: list[tuple[str, bool]] = []

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        self.asks += [(slot.key, ask.queued) for slot in ask.slots]
        return await super().take(ask, lease, ttl_s)


@pytest.mark.parametrize("placement", [fallback.Fallback, round_robin.RoundRobin])
async def test_only_a_queued_request_stands_in_line_and_only_for_the_last_deployment(
    clock, placement
):
    """A refusal sends a request on to the next deployment: a place in the first's line
    would have that pool set a slot aside for a replica that took another. It stands in
    one line, the last deployment's in the configured order however the candidates are
    rotated, and only from the queue, which the line is for."""
    store = QueuedAsks(clock)
    targets = deployments_a_and_b(store, clock, 1)
    dispatcher = Dispatcher(
        "m",
        [INTERACTIVE],
        targets,
        lambda lane: VirtualTokenCounter(),
        clock,
        placement=placement(),
    )
    runner = asyncio.create_task(dispatcher.run())
    try:
        held = [await granted(dispatcher, attempt(clock)) for _ in range(2)]
        before = len(store.asks)
        waiting = asyncio.create_task(granted(dispatcher, attempt(clock)))
        await settle()
        dispatcher.kick()
        await settle()
        a, b = keys.pool_slots("a"), keys.pool_slots("b")
        asks = store.asks[before:]
        tries = [sorted(asks[start : start + 2]) for start in range(0, len(asks), 2)]
        assert tries == [[(a, False), (b, False)], [(a, False), (b, True)], [(a, False), (b, True)]]
        await dispatcher.release(held[1])
        await settle()
        assert waiting.done()
    finally:
        runner.cancel()


def streamed(clock: FakeClock, lane: Lane, prompt_tokens: int, stream: bool = True) -> Attempt:
    request = call(clock, lane=lane)
    return Attempt(
        request._replace(stream=stream, prompt_tokens=prompt_tokens, reserved_tokens=prompt_tokens)
    )


def arrived_before(clock: FakeClock, lane: Lane, prompt_tokens: int, ago_s: float) -> Attempt:
    """A streamed prompt that arrived `ago_s` before now: its promise has that much less left."""
    late = streamed(clock, lane, prompt_tokens)
    late.call = late.call._replace(arrived_s=clock.now() - ago_s)
    return late


async def test_long_prompts_go_one_at_a_time_until_a_first_token_measures_the_prefill(clock):
    """A promise of 1 s leaves half of it to the prompts waiting for their first token.
    Before any first token one goes at a time; the first, 2,000 tokens in 0.125 s,
    teaches 16,000 tokens/s (8,000 tokens in 0.5 s), but only 2,000 were seen prefilled
    together, so 4,000 may wait together next. A non-streamed request (whose first token
    is never seen) is not held; one that ends without a first token frees its part."""
    lane = Lane("promised", queue_size=20, max_queue_age_s=5, ttft_slo_s=1.0)
    dispatcher = dispatcher_for([lane], Pool(PoolSpec("p", 20), leases(clock)), clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        first = await granted(dispatcher, streamed(clock, lane, 2_000))
        held = [asyncio.create_task(granted(dispatcher, streamed(clock, lane, 2_000)))]
        plain = await granted(dispatcher, streamed(clock, lane, 2_000, stream=False))
        await settle()
        assert not held[0].done()
        clock.advance(0.125)
        first.first_byte_s = clock.now()
        dispatcher.first_token(first, 0.125)
        held += [
            asyncio.create_task(granted(dispatcher, streamed(clock, lane, 2_000))) for _ in range(3)
        ]
        await settle()
        assert [task.done() for task in held] == [True, True, False, False]
        (deployment,) = dispatcher.view().targets
        assert deployment.prefill_pending_tokens == 4_000
        assert deployment.prefill_tokens_per_s == pytest.approx(16_000)
        ended = held[0].result()
        ended.end(None)
        await dispatcher.release(ended)
        await settle()
        assert [task.done() for task in held] == [True, True, True, False]
        held[3].cancel()
        for grant in [first, plain, *(task.result() for task in held[1:3])]:
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def measure_prefill(dispatcher: Dispatcher, clock: FakeClock, lane: Lane) -> Attempt:
    """Send one 2,000-token prompt and report its first token 0.125 s later: the
    deployment's budget learns 16,000 tokens/s. The first token's attempt stays held."""
    first = await granted(dispatcher, streamed(clock, lane, 2_000))
    clock.advance(0.125)
    first.first_byte_s = clock.now()
    dispatcher.first_token(first, 0.125)
    await settle()
    return first


async def test_a_prompt_that_waited_is_held_to_what_its_promise_has_left(clock):
    """Measured: 16,000 tokens/s, up to 4,000 tokens together. With 1,000 waiting, a
    fresh 1,000-token prompt goes; then, with 2,000 waiting, one that arrived 0.9 s ago,
    0.1 s of its 1 s promise left (1,600 tokens' prefill), is held."""
    lane = Lane("promised", queue_size=20, max_queue_age_s=5, ttft_slo_s=1.0)
    dispatcher = dispatcher_for([lane], Pool(PoolSpec("p", 20), leases(clock)), clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        first = await measure_prefill(dispatcher, clock, lane)
        waiting = await granted(dispatcher, streamed(clock, lane, 1_000))
        fresh = await granted(dispatcher, streamed(clock, lane, 1_000))
        held = asyncio.create_task(granted(dispatcher, arrived_before(clock, lane, 1_000, 0.9)))
        await settle()
        assert not held.done()
        held.cancel()
        for grant in (first, waiting, fresh):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


ONE_SECOND = Lane("promised", queue_size=20, max_queue_age_s=5, ttft_slo_s=1.0)
"""A 1 s promise: half of it, 0.5 s, for the prompts being prefilled."""


@contextlib.asynccontextmanager
async def full_after_a_measure(
    clock: FakeClock, disabled: frozenset[Mechanism] = frozenset()
) -> AsyncIterator[Dispatcher]:
    """A dispatcher whose two slots are held after one streamed prompt measured the
    prefill: 16,000 tokens/s, its first token 0.125 s after dispatch."""
    pool = Pool(PoolSpec("p", 2), leases(clock))
    dispatcher = dispatcher_for([ONE_SECOND], pool, clock, disabled=disabled)
    runner = asyncio.create_task(dispatcher.run())
    try:
        first = await measure_prefill(dispatcher, clock, ONE_SECOND)
        assert dispatcher.view().targets[0].prefill_tokens_per_s == pytest.approx(16_000)
        full = await granted(dispatcher, streamed(clock, ONE_SECOND, 10, stream=False))
        yield dispatcher
        for grant in (first, full):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_a_prompt_sent_on_what_its_promise_left_holds_newcomers_until_it_is_due(clock):
    """Measured: 16,000 tokens/s, up to 4,000 tokens together. A 1,000-token prompt that
    arrived 0.8 s before (0.2 s of its 1 s promise left) goes alone and is due 0.2 s
    later: a fresh 2,500-token prompt, which with it would take 0.22 s, waits. Its first
    token never comes; once its due time passes the fresh one goes, with nothing else
    happening to wake the queue."""
    lane = ONE_SECOND
    dispatcher = dispatcher_for([lane], Pool(PoolSpec("p", 20), leases(clock)), clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        first = await measure_prefill(dispatcher, clock, lane)
        late = await granted(dispatcher, arrived_before(clock, lane, 1_000, 0.8))
        fresh = asyncio.create_task(granted(dispatcher, streamed(clock, lane, 2_500)))
        await settle()
        clock.advance(0.19)
        await settle()
        assert not fresh.done()
        clock.advance(0.02)
        await settle()
        assert fresh.done()
        for grant in (first, late, fresh.result()):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_a_long_prompt_waits_only_what_its_promise_leaves_beyond_its_own_prefill(clock):
    """A 1,000-token prompt (its prefill 0.0625 s) may wait the 0.875 s the lane's time
    after dispatch leaves of a 1 s promise; a 12,000-token one needs 0.75 s alone, so it
    expires after 0.25 s: sent later, only a late answer could come of it."""
    async with full_after_a_measure(clock) as dispatcher:
        short = asyncio.create_task(granted(dispatcher, streamed(clock, ONE_SECOND, 1_000)))
        long = asyncio.create_task(granted(dispatcher, streamed(clock, ONE_SECOND, 12_000)))
        await settle()
        clock.advance(0.24)
        await settle()
        assert not long.done()
        clock.advance(0.02)
        await settle()
        assert long.done()
        assert not short.done()
        with pytest.raises(GatewayError) as info:
            await long
        assert info.value.code == "expired"
        clock.advance(0.6)
        await settle()
        assert not short.done()
        clock.advance(0.05)
        await settle()
        assert short.done()
        with pytest.raises(GatewayError) as info:
            await short
        assert info.value.code == "expired"


@pytest.mark.parametrize(("prompt_tokens", "queued"), [(14_000, True), (15_000, False)])
async def test_a_prompt_whose_wait_and_own_prefill_break_the_promise_is_refused(
    clock, prompt_tokens, queued
):
    """A predicted wait of 0.1 s and the prompt's own prefill: 0.875 s for 14,000 tokens
    fits a 1 s promise, 0.9375 s for 15,000 does not (the lane's 0.125 s after dispatch
    would let both queue)."""
    async with full_after_a_measure(clock) as dispatcher:
        dispatcher.rule.predictor.gap_s = 0.1
        prompt = streamed(clock, ONE_SECOND, prompt_tokens)
        waiter = asyncio.create_task(granted(dispatcher, prompt))
        await settle()
        assert waiter.done() is not queued
        if queued:
            waiter.cancel()
        else:
            with pytest.raises(GatewayError) as info:
                await waiter
            assert info.value.code == "overloaded"


async def test_a_prompt_whose_prefill_alone_takes_the_whole_promise_is_refused_at_once(clock):
    """17,000 tokens take more than the whole 1 s promise at 16,000 tokens/s: with the
    pool full the prompt is refused, before any service gap is measured, rather than
    queued to expire; 15,000 queue."""
    async with full_after_a_measure(clock) as dispatcher:
        assert dispatcher.rule.predictor.gap_s is None
        with pytest.raises(GatewayError) as info:
            await granted(dispatcher, streamed(clock, ONE_SECOND, 17_000))
        assert info.value.code == "overloaded"
        waiter = asyncio.create_task(granted(dispatcher, streamed(clock, ONE_SECOND, 15_000)))
        await settle()
        assert not waiter.done()
        waiter.cancel()


async def test_with_the_predictor_switched_off_a_request_queues_whatever_its_forecast(clock):
    """The prompt whose prefill alone breaks the promise queues, and waits the lane's
    whole `max_queue_age_s` (5 s), not what the promise leaves."""
    async with full_after_a_measure(clock, frozenset({Mechanism.PREDICTOR})) as dispatcher:
        waiter = asyncio.create_task(granted(dispatcher, streamed(clock, ONE_SECOND, 17_000)))
        await settle()
        assert not waiter.done()
        clock.advance(4.9)
        await settle()
        assert not waiter.done()
        clock.advance(0.2)
        await settle()
        assert waiter.exception().code == "expired"


async def test_without_a_promise_there_is_no_prefill_budget(clock):
    lane = Lane("plain", queue_size=20, max_queue_age_s=5)
    dispatcher = dispatcher_for([lane], Pool(PoolSpec("p", 20), leases(clock)), clock)
    grants = [await granted(dispatcher, streamed(clock, lane, 50_000)) for _ in range(3)]
    (deployment,) = dispatcher.view().targets
    assert deployment.prefill_pending_tokens is None
    for grant in grants:
        await dispatcher.release(grant)


async def test_a_prefill_budget_switched_off_counts_no_prompt(clock):
    dispatcher = dispatcher_for(
        [ONE_SECOND],
        Pool(PoolSpec("p", 20), leases(clock)),
        clock,
        disabled=frozenset({Mechanism.PREFILL_BUDGET}),
    )
    grants = [await granted(dispatcher, streamed(clock, ONE_SECOND, 50_000)) for _ in range(3)]
    (deployment,) = dispatcher.view().targets
    assert deployment.prefill_pending_tokens is None
    for grant in grants:
        await dispatcher.release(grant)


async def test_the_prefill_budget_is_the_deployments_whoever_sends_to_it(clock):
    """Two dispatchers on one deployment and one store (two replicas, as their shared
    store sees them): before any first token one long prompt goes at a time, whichever
    sends it; the first token, reported by one, teaches the rate the other's next
    prompts are held to (16,000 tokens/s, 4,000 tokens together), and frees the budget
    for them. Each sees the prompts it sent itself, and the rate as last told."""
    lane = Lane("promised", queue_size=20, max_queue_age_s=5, ttft_slo_s=1.0)
    pool = Pool(PoolSpec("p", 20), leases(clock))
    one, other = dispatcher_for([lane], pool, clock), dispatcher_for([lane], pool, clock)
    runners = [asyncio.create_task(dispatcher.run()) for dispatcher in (one, other)]
    try:
        first = await granted(one, streamed(clock, lane, 2_000))
        held = asyncio.create_task(granted(other, streamed(clock, lane, 2_000)))
        await settle()
        assert not held.done(), "the other's prompt waits for the budget"
        clock.advance(0.125)
        first.first_byte_s = clock.now()
        one.first_token(first, 0.125)
        await settle()
        assert held.done()
        second = await granted(other, streamed(clock, lane, 2_000))
        third = asyncio.create_task(granted(other, streamed(clock, lane, 2_000)))
        await settle()
        assert not third.done(), "4,000 tokens wait together at most"
        (heard,) = one.view().targets
        assert heard.prefill_tokens_per_s == pytest.approx(16_000)
        (sent,) = other.view().targets
        assert sent.prefill_pending_tokens == 4_000
        third.cancel()
        await one.release(first)
        for grant in (held.result(), second):
            await other.release(grant)
    finally:
        for runner in runners:
            runner.cancel()


class Streamed(Attempt):
    """An attempt with its stream's side of a hand-over at hand, as its relay keeps it."""

    giver: Giver

    @property
    def preempted(self) -> bool:
        return self.giver.agreed

    @preempted.setter
    def preempted(self, agreed: bool) -> None:
        self.giver.agreed = agreed

    @property
    def relayed_events(self) -> int:
        return self.giver.relayed_events

    @relayed_events.setter
    def relayed_events(self, events: int) -> None:
        self.giver.relayed_events = events


async def streaming(
    dispatcher: Dispatcher,
    clock: FakeClock,
    tenant: str,
    lane: Lane,
    prompt_tokens: int = 10,
    resumed: bool = False,
) -> Streamed:
    """A stream of `tenant` granted now and past its first token, one that may give its
    slot away unless it is the rest of an answer (`resumed`); the clock then moves on
    0.1 s."""
    request = call(clock, tenant=tenant, lane=lane)._replace(resumed=resumed)
    running = Streamed(request._replace(stream=True, prompt_tokens=prompt_tokens))
    running.giver = Giver()
    running.giver.interrupt = lambda: True
    await granted(dispatcher, running)
    running.first_byte_s = clock.now()
    dispatcher.first_token(running, 0.0)
    if not resumed:
        dispatcher.may_give(running, running.giver)
    clock.advance(0.1)
    return running


@pytest.mark.parametrize("off", [Mechanism.HANDOVER, Mechanism.WITHIN_SHARE])
async def test_with_hand_overs_switched_off_no_stream_gives_its_slot(clock, off):
    pool = Pool(PoolSpec("p", 2), leases(clock))
    dispatcher = dispatcher_for(
        [INTERACTIVE], pool, clock, deployment=RESUMABLE, disabled=frozenset({off})
    )
    runner = asyncio.create_task(dispatcher.run())
    try:
        held = [await streaming(dispatcher, clock, "a", INTERACTIVE) for _ in range(2)]
        waiting = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        dispatcher.kick()
        await settle()
        assert dispatcher.handover is None
        assert [running.preempted for running in held] == [False, False]
        waiting.cancel()
        for grant in held:
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_a_request_within_its_share_takes_the_slot_of_a_stream_beyond_it(clock):
    """`a` alone holds both slots with two streams (each within its share when it came).
    `b` then asks: one of two is within its share, so the stream of a's with less
    answered so far is asked to give its slot away (once: a second look does not ask
    the other), and b gets the slot when it does. a's own next request, beyond its
    share, asks nothing."""
    pool = Pool(PoolSpec("p", 2), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        first, last = [await streaming(dispatcher, clock, "a", INTERACTIVE) for _ in range(2)]
        first.relayed_events, last.relayed_events = 30, 20
        more = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="a")))
        await settle()
        assert (first.preempted, last.preempted) == (False, False)
        waiting = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        dispatcher.kick()
        await settle()
        assert (first.preempted, last.preempted) == (False, True)
        assert not waiting.done()
        assert dispatcher.view().lanes[0].preempted == 1
        await dispatcher.release(last)
        await settle()
        assert waiting.done()
        assert not more.done()
        more.cancel()
        for grant in (first, waiting.result()):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_a_lower_lane_gives_its_slot_before_a_tenant_beyond_its_share(clock):
    """Both slots taken, one by `a`'s interactive stream beyond its share and one by a
    lower lane's stream: for `b`'s request within its share the lower lane's goes, though
    it began last and has more to prefill again."""
    pool = Pool(PoolSpec("p", 2), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE, HEAVY], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        high = await streaming(dispatcher, clock, "a", INTERACTIVE)
        low = await streaming(dispatcher, clock, "batch", HEAVY, prompt_tokens=1_000)
        waiting = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        assert (low.preempted, high.preempted) == (True, False)
        waiting.cancel()
        for grant in (low, high):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_the_rest_of_an_answer_waits_ahead_of_new_work_and_is_not_judged_by_the_promise(
    clock,
):
    """A promised lane with no measure of its service queues at most one batch (here
    one request): `x`'s second newcomer is refused, but the rest of an answer of x's
    that gave its slot away is its caller's answer already, so it queues, goes before
    the newcomer queued earlier, and never gives its own slot away again."""
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        holder = await granted(dispatcher, attempt(clock, tenant="x", lane=PROMISED))
        fresh = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="x", lane=PROMISED)))
        await settle()
        with pytest.raises(GatewayError) as refused:
            await dispatcher.acquire(attempt(clock, tenant="x", lane=PROMISED))
        assert refused.value.code == "overloaded"
        rest = Streamed(call(clock, tenant="x", lane=PROMISED)._replace(stream=True, resumed=True))
        rest.giver = Giver()
        resumed = asyncio.create_task(granted(dispatcher, rest))
        await settle()
        assert not resumed.done()
        await dispatcher.release(holder)
        await settle()
        assert resumed.done()
        assert not fresh.done()
        rest.giver.interrupt = lambda: True
        rest.first_byte_s = clock.now()
        dispatcher.first_token(rest, 0.0)
        dispatcher.may_give(rest, rest.giver)
        within_share = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="b", lane=PROMISED))
        )
        await settle()
        assert not rest.preempted
        for task in (fresh, within_share):
            task.cancel()
        await dispatcher.release(rest)
    finally:
        runner.cancel()


async def test_a_tenant_within_its_share_never_takes_a_slot_from_its_own_stream(clock):
    """`a` holds one slot and `b` two, all within their shares when they came; `a`'s next
    request is within its share (1.5 of 3). Both tenants now hold as much as their share
    or more, and a's stream is the cheapest to prefill again, yet b's is the one asked:
    a's request would only take its own tenant's slot."""
    pool = Pool(PoolSpec("p", 3), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        own = await streaming(dispatcher, clock, "a", INTERACTIVE)
        others = [await streaming(dispatcher, clock, "b", INTERACTIVE, 20) for _ in range(2)]
        waiting = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="a")))
        await settle()
        assert not own.preempted
        assert [other.preempted for other in others].count(True) == 1
        waiting.cancel()
        for grant in (own, *others):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_of_the_streams_that_may_give_their_slot_the_cheapest_to_prefill_again_does(clock):
    """`a`, `c` and `d` hold a slot each, all beyond their share once `b` asks. c's prompt
    of 100 tokens with 50 answered (150 to prefill again) costs the engine least, less
    than a's 10 with 200 answered and d's 1,000-token prompt just begun."""
    pool = Pool(PoolSpec("p", 3), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        a = await streaming(dispatcher, clock, "a", INTERACTIVE)
        c = await streaming(dispatcher, clock, "c", INTERACTIVE, prompt_tokens=100)
        d = await streaming(dispatcher, clock, "d", INTERACTIVE, prompt_tokens=1_000)
        a.relayed_events, c.relayed_events = 200, 50
        waiting = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        assert (a.preempted, c.preempted, d.preempted) == (False, True, False)
        waiting.cancel()
        for grant in (a, c, d):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_the_rest_of_an_answer_is_prefilled_within_the_budget_not_by_its_promise(clock):
    """Long after its arrival, the rest of an answer is no prompt due by its promise: it
    joins a prompt waiting for its first token within the budget (4,000 tokens after a
    2,000-token measure), as a fresh prompt would."""
    dispatcher = dispatcher_for(
        [PROMISED], Pool(PoolSpec("p", 20), leases(clock)), clock, deployment=RESUMABLE
    )
    runner = asyncio.create_task(dispatcher.run())
    try:
        measured = await measure_prefill(dispatcher, clock, PROMISED)
        waiting = await granted(dispatcher, streamed(clock, PROMISED, 1_000))
        rest = arrived_before(clock, PROMISED, 1_000, ago_s=30.0)
        rest.call = rest.call._replace(resumed=True)
        resumed = asyncio.create_task(granted(dispatcher, rest))
        await settle()
        assert resumed.done()
        for grant in (measured, waiting, rest):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def hand_overs_asked(
    clock: FakeClock,
    lanes: list[Lane],
    held_in: Lane,
    asking: int,
    ends_every_s: float | None = None,
    ends_in_s: Sequence[float] = (0.1,) * 8,
    events: int = 11,
    tpot_s: float | None = None,
    rests_holding: int = 0,
    disabled: frozenset[Mechanism] = frozenset(),
) -> list[bool]:
    """After twenty of `a`'s requests ended `ends_every_s` apart (None: none yet), `a`'s
    streams in `held_in` hold all eight slots, each `ends_in_s` from its `max_tokens` at
    a pace of about 0.1 s a token over its `events` after the first bytes (the last
    0.05 s ago); the last `rests_holding` of them are rests of answers, which may not
    give their slot: their relays count no events, and they resumed 0.05 s ago, `ends_in_s`
    at their backend's pace. The backend's metrics read `tpot_s` a token. `b` then sends
    `asking` requests within its share: which streams are asked to give their slot.
    The dispatch gap reads a thousandth of a second, as a burst of dispatches leaves
    it: the pause is not its."""
    pool = Pool(PoolSpec("p", 8), leases(clock))
    gate = Gate()
    gate.tpot_s = tpot_s
    dispatcher = dispatcher_for(lanes, pool, clock, gate, RESUMABLE, disabled=disabled)
    runner = asyncio.create_task(dispatcher.run())
    try:
        for _ in range(0 if ends_every_s is None else 20):
            ended = await granted(dispatcher, attempt(clock, "a", lane=held_in))
            clock.advance(ends_every_s)
            await dispatcher.release(ended)
        held = [
            await streaming(dispatcher, clock, "a", held_in, resumed=i >= 8 - rests_holding)
            for i in range(8)
        ]
        for running, end_s in zip(held, ends_in_s, strict=True):
            left = round(end_s / 0.1)
            if running.call.resumed:
                running.first_byte_s = clock.now() - 0.05
                running.call = running.call._replace(reserved_tokens=10 + left)
                continue
            running.relayed_events = events
            running.first_byte_s = clock.now() - 0.1 * events - 0.05
            running.call = running.call._replace(reserved_tokens=10 + events + left)
        dispatcher.rule.predictor.gap_s = 0.001
        waiting = [
            asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
            for _ in range(asking)
        ]
        await settle()
        assert dispatcher.queues["interactive"].within_share == asking
        asked = [running.preempted for running in held]
        for task in waiting:
            task.cancel()
        for grant in held:
            await dispatcher.release(grant)
        return asked
    finally:
        runner.cancel()


@pytest.mark.parametrize(("asking", "asked"), [(2, 2), (3, 2)])
async def test_requests_queued_within_their_share_have_slots_handed_over_at_once(
    clock, asking, asked
):
    """`a` alone holds all eight slots; `b` then sends `asking` requests, all within its
    share (four of eight). They ask together, not each once it reaches the head of the
    queue, but at most a quarter of the batch (two) is handed over and not yet resumed
    at once: each rest takes the next free slot, and more would wait more completions."""
    assert (await hand_overs_asked(clock, [INTERACTIVE], INTERACTIVE, asking)).count(True) == asked


@pytest.mark.parametrize(("ends_every_s", "asked"), [(None, 0), (0.8, 2), (1.5, 1), (3.0, 0)])
async def test_a_stream_of_a_promised_lane_is_not_paused_past_its_promise(
    clock, ends_every_s, asked
):
    """`a`'s streams hold all eight slots in a lower lane that promises 2 s; `b` sends
    two requests within its share above it. A stream is asked only while its rest,
    resuming behind the rests already waiting one slot's end apart, would stand still
    no longer than its lane's promise: with ends 0.8 s apart both are asked (the gap
    reads 0.74-0.87 s, as it is read at the last end or 0.85 s after it), 1.5 s apart
    one (1.3-1.54 s: a second would wait over 2.6 s), 3 s apart none (2.26 s and more).
    Before any end, when a slot comes free is unknown, and none is asked."""
    asked_of = await hand_overs_asked(clock, [INTERACTIVE, LOWER], LOWER, 2, ends_every_s)
    assert asked_of.count(True) == asked


@pytest.mark.parametrize("ends_every_s", [None, 3.0])
async def test_with_turnover_switched_off_only_the_streams_ends_bound_the_pause(
    clock, ends_every_s
):
    """Slots that came free rarely, or never yet, keep every stream running while the
    rate they come free at is read; without it, streams due to end within 0.1 s are
    asked as if slots came free at once."""
    asked_of = await hand_overs_asked(
        clock,
        [INTERACTIVE, LOWER],
        LOWER,
        2,
        ends_every_s,
        disabled=frozenset({Mechanism.TURNOVER}),
    )
    assert asked_of.count(True) == 2


@pytest.mark.parametrize(
    ("ends_in_s", "asked"),
    [
        ((1.5, 3.0, 4.5, 6.0, 7.5, 9.0, 10.5, 12.0), [False, True] + [False] * 6),
        ((2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 17.5, 20.0), [False] * 8),
        ((1.5, 1.5) + (20.0,) * 6, [True] + [False] * 7),
    ],
)
async def test_a_stream_is_paused_only_while_others_must_end_within_the_promise(
    clock, ends_in_s, asked
):
    """Slots came free every 0.1 s lately, but ends come in clumps, and the rate
    promises nothing about the next seconds. Each stream holding a slot ends at the
    latest at its `max_tokens`, at its own pace: with the soonest of them due within
    1.5 s, one stream is asked, not that one (the rest waits on it); a second rest
    would wait for the end due at 4.5 s. With the soonest due at 2.5 s, none. With two
    due within 1.5 s, the first is asked, and its slot goes to its taker: the second
    rest would wait for the other's end and then one due at 20 s."""
    asked_of = await hand_overs_asked(clock, [INTERACTIVE, LOWER], LOWER, 2, 0.1, ends_in_s)
    assert asked_of == asked


async def test_a_backend_slowed_since_the_streams_began_ends_them_later(clock):
    """The streams paced 0.1 s a token since their first, and the soonest is due within
    1.5 s at that pace; but the backend's metrics read 0.3 s a token now (a slowdown):
    at that pace it is due in 4.5 s, and none is asked."""
    ends_in_s = (1.5, 3.0, 4.5, 6.0, 7.5, 9.0, 10.5, 12.0)
    asked_of = await hand_overs_asked(
        clock, [INTERACTIVE, LOWER], LOWER, 2, 0.1, ends_in_s, tpot_s=0.3
    )
    assert asked_of == [False] * 8


@pytest.mark.parametrize(
    ("tpot_s", "asked"), [(None, [False] * 8), (0.1, [True, True] + [False] * 6)]
)
async def test_a_stream_not_yet_a_second_old_is_paced_by_its_backend(clock, tpot_s, asked):
    """A stream's first events may come together and read as no time a token: streams
    one token short of their `max_tokens`, three events in 0.35 s, are not counted on
    by their own pace, and none is asked; by their backend's (0.1 s a token, from its
    metrics) they end within the promise, and two are."""
    asked_of = await hand_overs_asked(
        clock, [INTERACTIVE, LOWER], LOWER, 2, 0.1, events=3, tpot_s=tpot_s
    )
    assert asked_of == asked


async def test_the_rests_of_answers_holding_slots_end_too(clock):
    """Six streams that may give their slot end in 20 s at the soonest; two rests of
    answers, which may not, end within 0.5 and 1 s at their backend's pace: their slots
    come free within the promise, so two streams are asked."""
    ends_in_s = (20.0,) * 6 + (0.5, 1.0)
    asked_of = await hand_overs_asked(
        clock, [INTERACTIVE, LOWER], LOWER, 2, 0.1, ends_in_s, tpot_s=0.1, rests_holding=2
    )
    assert asked_of == [True, True] + [False] * 6


async def test_a_slot_handed_over_is_no_slot_coming_free(clock):
    """A slot handed over is its taker's. For the service gap, the time between slots
    coming free that queued requests wait on, `b`'s request dispatched into the slot
    `a`'s stream handed over at 0.5 s does not count: the gap measured between a's two
    queued requests is the 2 s between completions, not pulled towards the 1 s a
    hand-over's dispatch would make it. Nor is the hand-over an end for the turnover
    the pause bound reads; b's request ending is."""
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        start = clock.now()
        stream = await streaming(dispatcher, clock, "a", INTERACTIVE)
        queued = [asyncio.create_task(granted(dispatcher, attempt(clock, "a"))) for _ in range(2)]
        given = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        assert stream.preempted
        clock.advance(start + 0.5 - clock.now())
        await dispatcher.release(stream)
        assert dispatcher.handover.turnover.gap_s(clock.now()) == math.inf
        b = await given
        clock.advance(1.0)
        await dispatcher.release(b)
        assert dispatcher.handover.turnover.gap_s(clock.now()) < math.inf
        first = await queued[0]
        clock.advance(2.0)
        await dispatcher.release(first)
        await settle()
        assert queued[1].done()
        assert dispatcher.rule.predictor.gap_s == pytest.approx(2.0)
        await dispatcher.release(queued[1].result())
    finally:
        runner.cancel()


@pytest.mark.parametrize("gave", [True, False])
async def test_a_waiter_whose_stream_withdrew_may_ask_again(clock, gave):
    """`b`'s request has `a`'s stream agree to give its slot; the backend's gate then
    holds b's request, so the freed slot is not taken at once. If the stream gave its
    slot (`gave`), b's request keeps its ask: the rest of a's answer is on its way and
    the slot is b's. If it withdrew (its answer ended first), b's request may ask
    another stream; a slot taken meanwhile elsewhere would otherwise leave it waiting
    for a completion."""
    gate = Gate()
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock, gate, RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        stream = await streaming(dispatcher, clock, "a", INTERACTIVE)
        waiting = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        assert stream.preempted
        (waiter,) = dispatcher.queues["interactive"].within_share_waiters()
        assert dispatcher.handover.asks(waiter)
        gate.set(set())
        stream.preempted = gave
        await dispatcher.release(stream)
        await settle()
        assert not waiting.done()
        assert dispatcher.handover.asks(waiter) is gave
        gate.set(None)
        await settle()
        assert waiting.done()
        await dispatcher.release(waiting.result())
    finally:
        runner.cancel()


async def test_the_rest_of_an_answer_goes_only_where_an_answer_is_continued(clock):
    """Two deployments, only `r` resumable and its one slot held: the rest of an answer
    waits for r although `plain` has room, and goes to r once it is free."""
    store = MemoryLimitStore(clock)
    pools = [Pool(PoolSpec(name, 1), Leases(store, clock)) for name in ("plain", "r")]
    targets = [
        Target(
            dataclasses.replace(DEPLOYMENT, name=name, pools=(name,), resumable=name == "r"),
            (pool,),
            Gate(),
            Breaker(BreakerPolicy(), clock),
        )
        for name, pool in zip(("plain", "r"), pools, strict=True)
    ]
    dispatcher = Dispatcher("m", [INTERACTIVE], targets, lambda lane: VirtualTokenCounter(), clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        holder = Attempt(call(clock, tenant="x"), avoid=frozenset({"plain"}))
        await granted(dispatcher, holder)
        assert holder.target is not None
        assert holder.target.deployment.name == "r"
        rest = Attempt(call(clock, tenant="a")._replace(stream=True, resumed=True))
        resumed = asyncio.create_task(granted(dispatcher, rest))
        await settle()
        assert not resumed.done()
        await dispatcher.release(holder)
        await settle()
        assert resumed.done()
        assert rest.target is not None
        assert rest.target.deployment.name == "r"
        await dispatcher.release(rest)
    finally:
        runner.cancel()


async def test_the_rest_of_an_answer_in_a_paused_lane_still_goes(clock):
    """The overload ladder pauses the background lane; the rest of an answer of that lane
    is its caller's answer already, mid-stream: it goes at once to a free slot, and
    queued behind a full pool it goes when a slot frees, while the lane's fresh work
    waits."""
    bulk = Lane("bulk", priority=0, queue_size=100, max_queue_age_s=5)
    pool = Pool(PoolSpec("p", 2), leases(clock))
    dispatcher = dispatcher_for(
        [INTERACTIVE, bulk], pool, clock, deployment=RESUMABLE, paused=lambda lane: lane is bulk
    )
    runner = asyncio.create_task(dispatcher.run())
    try:
        fresh = asyncio.create_task(granted(dispatcher, attempt(clock, lane=bulk)))
        first = Attempt(call(clock, lane=bulk)._replace(stream=True, resumed=True))
        await granted(dispatcher, first)
        holder = await granted(dispatcher, attempt(clock, tenant="x"))
        second = Attempt(call(clock, lane=bulk)._replace(stream=True, resumed=True))
        queued = asyncio.create_task(granted(dispatcher, second))
        await settle()
        assert not queued.done()
        await dispatcher.release(holder)
        await settle()
        assert queued.done()
        assert not fresh.done()
        fresh.cancel()
        for grant in (first, second):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_the_rest_of_an_answer_may_take_the_slots_kept_for_requests_within_a_share(clock):
    """With one of four slots kept free (the reserve) and three held, a request that may
    not take it (a retry its caller announces) waits, the rest of an answer goes: at
    once, and, queued behind a full pool, when a slot frees into the reserve. No prefill
    budget: the rests hold their prompts here without a first token."""
    pool = Pool(PoolSpec("p", 4), leases(clock))
    unbudgeted = frozenset({Mechanism.PREFILL_BUDGET})
    dispatcher = dispatcher_for([GUARDED], pool, clock, deployment=RESUMABLE, disabled=unbudgeted)
    runner = asyncio.create_task(dispatcher.run())
    try:
        held = [
            await granted(dispatcher, attempt(clock, tenant="x", lane=GUARDED)) for _ in range(3)
        ]
        reserving(dispatcher, 1)
        retried = Attempt(call(clock, tenant="x", lane=GUARDED)._replace(client_retries=1))
        fresh = asyncio.create_task(granted(dispatcher, retried))
        await settle()
        assert not fresh.done()
        fresh.cancel()
        rest = Attempt(call(clock, tenant="x", lane=GUARDED)._replace(stream=True, resumed=True))
        held.append(await granted(dispatcher, rest))
        later = Attempt(call(clock, tenant="x", lane=GUARDED)._replace(stream=True, resumed=True))
        queued = asyncio.create_task(granted(dispatcher, later))
        await settle()
        assert not queued.done()
        await dispatcher.release(held.pop(0))
        await settle()
        assert queued.done()
        for grant in (*held, later):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_the_rest_of_an_answer_waits_past_a_full_queue_and_its_age_limit_until_its_deadline(
    clock,
):
    """A lane of one queued request that may wait 0.05 s: with its queue full, the rest of
    an answer still queues, outlives the age limit, and is answered only at its
    deadline; it counts among what its tenant holds, not as the lane's oldest wait
    (starvation, overload). Its tenant is charged its output, not its prompt again."""
    tight = Lane("tight", priority=100, queue_size=1, max_queue_age_s=0.05)
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([tight], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        holder = await granted(dispatcher, attempt(clock, tenant="x", lane=tight))
        full = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="x", lane=tight)))
        await settle()
        assert dispatcher.view().lanes[0].queued == tight.queue_size
        rest = Attempt(
            call(clock, tenant="a", lane=tight, deadline_in_s=1.0)._replace(resumed=True)
        )
        resumed = asyncio.create_task(granted(dispatcher, rest))
        await settle()
        clock.advance(0.5)
        await settle()
        assert full.exception() is not None
        assert not resumed.done()
        assert dispatcher.handover.queued(dispatcher.queues["tight"])("a") == 1
        assert dispatcher.queues["tight"].oldest_enqueued_s() is None, "no starving, no overload"
        clock.advance(0.5)
        await settle()
        with pytest.raises(GatewayError) as late:
            resumed.result()
        assert late.value.code == "deadline_exceeded"
        await dispatcher.release(holder)
        charged = Attempt(call(clock, tenant="b", lane=tight)._replace(resumed=True))
        await granted(dispatcher, charged)
        expected = VirtualTokenCounter()
        expected.charge("b", 0, 10)
        assert dispatcher.queues["tight"].fairness.service()["b"] == expected.service()["b"]
        await dispatcher.release(charged)
    finally:
        runner.cancel()


def rest_of_answer(clock: FakeClock, tenant: str, lane: Lane = INTERACTIVE) -> Attempt:
    """The rest of an answer of `tenant` whose stream gave its slot away."""
    return Attempt(call(clock, tenant=tenant, lane=lane)._replace(stream=True, resumed=True))


async def test_the_rest_of_an_answer_goes_first_and_holds_back_further_hand_overs(clock):
    """One slot, held by `x`'s stream; the rest of `a`'s answer and then a request of `b`
    within its share wait. b's request asks no hand-over (the next free slot is the rest
    of a's answer's, and another would only queue behind it), and the freed slot goes
    to the rest of a's answer, then the next to b's."""
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE, HEAVY], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        holder = await streaming(dispatcher, clock, "x", INTERACTIVE)
        rest = rest_of_answer(clock, "a", HEAVY)
        resumed = asyncio.create_task(granted(dispatcher, rest))
        within_share = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        assert dispatcher.queues["interactive"].within_share == 1
        assert not holder.preempted
        await dispatcher.release(holder)
        await settle()
        assert resumed.done()
        assert not within_share.done()
        await dispatcher.release(rest)
        await settle()
        assert within_share.done()
        await dispatcher.release(within_share.result())
    finally:
        runner.cancel()


async def test_a_slot_handed_over_goes_to_the_request_it_was_given_for(clock):
    """`b`'s request within its share has `a`'s stream give its slot; the rest of
    another answer queued meanwhile does not take that slot."""
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        stream = await streaming(dispatcher, clock, "a", INTERACTIVE)
        within_share = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="b")))
        await settle()
        assert stream.preempted
        other = rest_of_answer(clock, "c")
        resumed = asyncio.create_task(granted(dispatcher, other))
        await settle()
        await dispatcher.release(stream)
        await settle()
        assert within_share.done()
        assert not resumed.done()
        resumed.cancel()
        await dispatcher.release(within_share.result())
    finally:
        runner.cancel()


async def test_the_rest_of_an_answer_is_not_held_to_its_lanes_share(clock):
    """The background lane may hold one of two slots while the lane above is busy: its
    next fresh request waits, the rest of one of its answers takes the free slot."""
    pool = Pool(PoolSpec("p", 2), leases(clock))
    dispatcher = dispatcher_for([INTERACTIVE, BACKGROUND], pool, clock, deployment=RESUMABLE)
    runner = asyncio.create_task(dispatcher.run())
    try:
        held = await granted(dispatcher, attempt(clock, lane=BACKGROUND))
        fresh = asyncio.create_task(granted(dispatcher, attempt(clock, lane=BACKGROUND)))
        await settle()
        assert not fresh.done()
        fresh.cancel()
        rest = await granted(dispatcher, rest_of_answer(clock, "a", BACKGROUND))
        for grant in (held, rest):
            await dispatcher.release(grant)
    finally:
        runner.cancel()


async def test_the_prefill_budget_learns_nothing_from_the_rest_of_an_answer(clock):
    """2,000 tokens prefilled in 0.125 s teach 16,000 tokens/s; the rest of an answer,
    2,000 tokens whose first token comes 10 ms later (an engine that cached most of
    them), does not teach 200,000."""
    dispatcher = dispatcher_for(
        [PROMISED], Pool(PoolSpec("p", 20), leases(clock)), clock, deployment=RESUMABLE
    )
    runner = asyncio.create_task(dispatcher.run())
    try:
        measured = await measure_prefill(dispatcher, clock, PROMISED)
        rest = rest_of_answer(clock, "a", PROMISED)
        rest.call = rest.call._replace(prompt_tokens=2_000, reserved_tokens=2_010)
        await granted(dispatcher, rest)
        clock.advance(0.01)
        rest.first_byte_s = clock.now()
        dispatcher.first_token(rest, 5.0)
        await settle()
        (deployment,) = dispatcher.view().targets
        assert deployment.prefill_tokens_per_s == pytest.approx(16_000)
        assert deployment.prefill_pending_tokens == 0
        for grant in (measured, rest):
            await dispatcher.release(grant)
    finally:
        runner.cancel()
