"""The dispatcher with real pools and a gate the test controls; no sleeps beyond a few ms."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable

import pytest

from sluicegate.capacity.breaker import Breaker
from sluicegate.capacity.gates import GateState
from sluicegate.capacity.pools import Pool
from sluicegate.core.call import Call
from sluicegate.core.clock import Clock, MonotonicClock
from sluicegate.core.errors import GatewayError
from sluicegate.core.types import (
    BreakerPolicy,
    Deployment,
    Endpoint,
    Lane,
    Model,
    PoolSpec,
    RoutePolicy,
    Tenant,
    Timeouts,
)
from sluicegate.scheduling.dispatcher import Dispatcher, Target
from sluicegate.scheduling.fairness import VirtualTokenCounter
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock

CLOCK = MonotonicClock()
INTERACTIVE = Lane("interactive", priority=100, queue_size=100, max_queue_age_s=5)
HEAVY = Lane("heavy", priority=50, queue_size=100, max_queue_age_s=5, starvation_s=0.05)
BACKGROUND = Lane("background", priority=0, queue_size=100, max_queue_age_s=5, max_share=0.5)
SHORT = Lane("short", priority=100, queue_size=10, max_queue_age_s=0.05)
DEPLOYMENT = Deployment("d", "openai", "http://x/v1", "m", None, Timeouts(1, 1, 1), 8, ("p",))


class Gate:
    """A backend gate the test opens and closes by hand."""

    def __init__(self) -> None:
        self.open_for: set[str] | None = None
        self._listeners: list[Callable[[], None]] = []

    def admits(self, lane: Lane) -> bool:
        return self.open_for is None or lane.name in self.open_for

    def sent(self) -> None: ...

    def done(self, first_byte_s: float | None) -> None: ...

    def state(self) -> GateState:
        return GateState.OPEN

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def set(self, open_for: set[str] | None) -> None:
        self.open_for = open_for
        for listener in self._listeners:
            listener()


def dispatcher_for(
    lanes: list[Lane], pool: Pool, gate: Gate | None = None, clock: Clock = CLOCK, **options
):
    """One deployment behind `pool`, VTC fairness, the real clock unless told otherwise."""
    target = Target(DEPLOYMENT, (pool,), gate or Gate(), Breaker(BreakerPolicy(), clock))
    return Dispatcher("m", lanes, [target], lambda lane: VirtualTokenCounter(), clock, **options)


@pytest.fixture
async def setup():
    pool = Pool(PoolSpec("p", 1), MemoryLimitStore(CLOCK))
    gate = Gate()
    dispatcher = dispatcher_for([INTERACTIVE, HEAVY, BACKGROUND, SHORT], pool, gate)
    runner = asyncio.create_task(dispatcher.run())
    yield dispatcher, pool, gate
    runner.cancel()


def call(tenant="a", lane=INTERACTIVE, deadline_in_s=10.0) -> Call:
    now = CLOCK.now()
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


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def serve_in_turn(dispatcher: Dispatcher, waiting: list[tuple[str, Call]]) -> list[str]:
    """With the only permit held, queue `waiting` in order, then release one grant at a
    time and return the labels in the order they were dispatched."""
    holder = call()
    grant, current = await dispatcher.acquire(holder), holder
    tasks = {}
    for label, c in waiting:
        tasks[asyncio.create_task(dispatcher.acquire(c))] = (label, c)
        await settle()
    order: list[str] = []
    while tasks:
        await dispatcher.release(grant, current)
        done, _ = await asyncio.wait(tasks, timeout=1, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        task = done.pop()
        label, current = tasks.pop(task)
        order.append(label)
        grant = task.result()
    await dispatcher.release(grant, current)
    return order


async def test_an_idle_system_dispatches_at_once_and_release_frees_the_pool(setup):
    dispatcher, pool, _ = setup
    c = call()
    grant = await dispatcher.acquire(c)
    assert pool.counters.active == 1
    assert c.dispatched_s is not None
    await dispatcher.release(grant, c)
    assert pool.counters.active == 0


async def test_a_lane_without_a_queue_refuses_at_once(setup):
    dispatcher, _, _ = setup
    held = call()
    grant = await dispatcher.acquire(held)
    with pytest.raises(GatewayError) as info:
        await dispatcher.acquire(call(lane=Lane("now", priority=100)))
    assert info.value.code == "capacity_exhausted"
    await dispatcher.release(grant, held)


async def test_a_release_wakes_the_next_waiter(setup):
    dispatcher, pool, _ = setup
    first = call()
    grant = await dispatcher.acquire(first)
    waiter = asyncio.create_task(dispatcher.acquire(call()))
    await settle()
    assert not waiter.done()
    await dispatcher.release(grant, first)
    second = await asyncio.wait_for(waiter, 1)
    assert pool.counters.active == 1
    assert second.lane is INTERACTIVE


async def test_lanes_are_served_by_priority(setup):
    dispatcher, _, _ = setup
    waiting = [("background", call(lane=BACKGROUND)), ("interactive", call())]
    assert await serve_in_turn(dispatcher, waiting) == ["interactive", "background"]


async def test_a_late_tenant_is_served_before_an_earlier_backlog_drains(setup):
    dispatcher, _, _ = setup
    waiting = [("a", call("a")) for _ in range(5)] + [("b", call("b"))]
    order = await serve_in_turn(dispatcher, waiting)
    assert order.index("b") <= 1


async def test_queued_work_expires_without_being_dispatched(setup):
    dispatcher, pool, _ = setup
    holder = call()
    grant = await dispatcher.acquire(holder)
    with pytest.raises(GatewayError) as info:
        await dispatcher.acquire(call(lane=SHORT))
    assert (info.value.status, info.value.code) == (503, "expired")
    with pytest.raises(GatewayError) as info:
        await dispatcher.acquire(call(deadline_in_s=0.1))
    assert (info.value.status, info.value.code) == (504, "deadline_exceeded")
    assert all(q.size == 0 for q in dispatcher.queues.values())
    await dispatcher.release(grant, holder)
    assert pool.counters.active == 0


async def test_a_caller_that_leaves_is_never_dispatched(setup):
    dispatcher, pool, _ = setup
    holder = call()
    grant = await dispatcher.acquire(holder)
    waiter = asyncio.create_task(dispatcher.acquire(call()))
    await settle()
    waiter.cancel()
    await settle()
    assert dispatcher.queues["interactive"].size == 0
    await dispatcher.release(grant, holder)
    await settle()
    assert pool.counters.active == 0
    assert dispatcher.stats["interactive"].dispatched == 1


async def test_the_backend_gate_holds_a_lane_until_it_opens(setup):
    dispatcher, _, gate = setup
    gate.set({"interactive"})
    waiter = asyncio.create_task(dispatcher.acquire(call(lane=BACKGROUND)))
    await settle()
    assert not waiter.done()
    gate.set(None)
    grant = await asyncio.wait_for(waiter, 1)
    assert grant.lane is BACKGROUND


async def test_a_lane_share_reserves_the_rest_of_the_pool():
    pool = Pool(PoolSpec("p", 4), MemoryLimitStore(CLOCK))
    dispatcher = dispatcher_for([INTERACTIVE, BACKGROUND], pool)
    runner = asyncio.create_task(dispatcher.run())
    try:
        grants = [await dispatcher.acquire(call(lane=BACKGROUND)) for _ in range(2)]
        third = asyncio.create_task(dispatcher.acquire(call(lane=BACKGROUND)))
        await settle()
        assert not third.done()
        grants += [await dispatcher.acquire(call()) for _ in range(2)]
        assert pool.counters.active == 4
        third.cancel()
    finally:
        runner.cancel()


async def test_a_starving_lane_goes_before_higher_ones(setup):
    dispatcher, _, _ = setup
    holder = call()
    grant = await dispatcher.acquire(holder)
    heavy = asyncio.create_task(dispatcher.acquire(call(lane=HEAVY)))
    await asyncio.sleep(0.08)
    interactive = asyncio.create_task(dispatcher.acquire(call()))
    await settle()
    await dispatcher.release(grant, holder)
    await asyncio.wait_for(heavy, 1)
    await settle()
    assert not interactive.done()
    interactive.cancel()


@pytest.mark.parametrize(("ttft_slo_s", "age_s"), [(1.0, 5.0), (10.0, 1.0)])
async def test_a_lane_whose_expected_wait_breaks_its_promise_refuses(setup, ttft_slo_s, age_s):
    """Expected wait 1.5 s: beyond the TTFT promise, or beyond the queue's age limit."""
    dispatcher, _, _ = setup
    promised = Lane(
        "promised", priority=100, queue_size=100, max_queue_age_s=age_s, ttft_slo_s=ttft_slo_s
    )
    dispatcher.queues["promised"] = dispatcher.queues["interactive"]
    holder = call()
    grant = await dispatcher.acquire(holder)
    waiters = [asyncio.create_task(dispatcher.acquire(call())) for _ in range(3)]
    await settle()
    dispatcher.dispatch_interval_s = 0.5
    with pytest.raises(GatewayError) as info:
        await dispatcher.acquire(call(lane=promised))
    assert (info.value.status, info.value.code) == (503, "overloaded")
    for waiter in waiters:
        waiter.cancel()
    await dispatcher.release(grant, holder)


async def test_a_paused_lane_waits_until_unpaused():
    pool = Pool(PoolSpec("p", 4), MemoryLimitStore(CLOCK))
    paused = {"background"}
    dispatcher = dispatcher_for(
        [INTERACTIVE, BACKGROUND], pool, paused=lambda lane: lane.name in paused
    )
    runner = asyncio.create_task(dispatcher.run())
    try:
        waiter = asyncio.create_task(dispatcher.acquire(call(lane=BACKGROUND)))
        await dispatcher.acquire(call())
        await settle()
        assert not waiter.done()
        paused.clear()
        dispatcher.kick()
        await asyncio.wait_for(waiter, 1)
    finally:
        runner.cancel()


async def test_a_paced_lane_spreads_its_dispatches():
    pool = Pool(PoolSpec("p", 10), MemoryLimitStore(CLOCK))
    paced = Lane("paced", queue_size=10, max_queue_age_s=5, max_dispatch_rate=20)
    dispatcher = dispatcher_for([paced], pool)
    runner = asyncio.create_task(dispatcher.run())
    try:
        started = CLOCK.now()
        calls = [call(lane=paced) for _ in range(4)]
        await asyncio.gather(*(dispatcher.acquire(c) for c in calls))
        times = sorted(c.dispatched_s - started for c in calls)
    finally:
        runner.cancel()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= 0.045 for gap in gaps), times


async def test_a_fast_paced_lane_keeps_dispatching():
    """Sub-millisecond waits: uvloop answers call_at with a plain Handle then (no when()),
    which once stopped the dispatcher for good."""
    pool = Pool(PoolSpec("p", 50), MemoryLimitStore(CLOCK))
    paced = Lane("paced", queue_size=50, max_queue_age_s=5, max_dispatch_rate=2000)
    dispatcher = dispatcher_for([paced], pool)
    runner = asyncio.create_task(dispatcher.run())
    try:
        calls = [call(lane=paced) for _ in range(40)]
        await asyncio.wait_for(asyncio.gather(*(dispatcher.acquire(c) for c in calls)), 2)
    finally:
        runner.cancel()


@pytest.mark.parametrize("target_s", [None, 0.05])
async def test_lower_lanes_yield_when_the_top_lanes_first_tokens_are_late(target_s):
    clock = FakeClock()
    top = Lane("interactive", priority=100, queue_size=10, ttft_target_s=target_s)
    low = Lane("background", queue_size=10, max_queue_age_s=60)
    pool = Pool(PoolSpec("p", 10), MemoryLimitStore(clock))
    dispatcher = dispatcher_for([top, low], pool, clock=clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        dispatcher.first_token(call(lane=top), 10 * 0.05)
        clock.advance(1.5)
        await dispatcher.acquire(call(lane=low))
        second = asyncio.create_task(dispatcher.acquire(call(lane=low)))
        await settle()
        assert second.done() == (target_s is None)
    finally:
        second.cancel()
        runner.cancel()


@pytest.mark.parametrize(("age_s", "queued"), [(1.0, False), (30.0, True)])
async def test_a_known_wait_longer_than_the_queue_allows_is_answered_at_once(age_s, queued):
    """An open circuit names its reopening time: a request that could not wait that long
    gets 503 circuit_open with Retry-After now, rather than waiting to expire."""
    clock = FakeClock()
    lane = Lane("default", queue_size=10, max_queue_age_s=age_s)
    pool = Pool(PoolSpec("p", 4), MemoryLimitStore(clock))
    dispatcher = dispatcher_for([lane], pool, clock=clock)
    breaker = dispatcher.targets[0].breaker
    for _ in range(breaker.policy.consecutive_failures):
        breaker.started()
        breaker.record(False)
    attempt = asyncio.create_task(dispatcher.acquire(call(lane=lane)))
    await settle()
    assert attempt.done() != queued
    if not queued:
        err = attempt.exception()
        assert isinstance(err, GatewayError)
        assert err.code == "circuit_open"
        policy = breaker.policy
        assert policy.open_s <= (err.retry_after_s or 0) <= policy.open_s + policy.ramp_s
    attempt.cancel()


async def test_a_queued_request_is_answered_when_a_circuit_opens_for_longer_than_it_may_wait():
    clock = FakeClock()
    lane = Lane("default", queue_size=10, max_queue_age_s=1)
    pool = Pool(PoolSpec("p", 1), MemoryLimitStore(clock))
    dispatcher = dispatcher_for([lane], pool, clock=clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        await dispatcher.acquire(call(lane=lane))
        waiting = asyncio.create_task(dispatcher.acquire(call(lane=lane)))
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
    finally:
        runner.cancel()


async def test_lower_lanes_hold_while_a_top_lane_stream_awaits_its_first_token():
    clock = FakeClock()
    top = Lane("interactive", priority=100, queue_size=10, ttft_target_s=0.05)
    low = Lane("background", queue_size=10, max_queue_age_s=60)
    pool = Pool(PoolSpec("p", 10), MemoryLimitStore(clock))
    dispatcher = dispatcher_for([top, low], pool, clock=clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        streamed = dataclasses.replace(call(lane=top), stream=True)
        await dispatcher.acquire(streamed)
        background = asyncio.create_task(dispatcher.acquire(call(lane=low)))
        await settle()
        assert not background.done()
        dispatcher.first_token(streamed, 0.01)
        await asyncio.wait_for(background, 1)
    finally:
        runner.cancel()


@pytest.mark.parametrize(("retries", "refused"), [(0, False), (1, True)])
async def test_announced_retries_do_not_count_against_a_first_attempts_promise(retries, refused):
    """Three retries queued at 0.5 s per dispatch: 1.5 s, beyond a 1 s promise, for a
    newcomer that queues behind them (a retry), not for one that goes before them."""
    pool = Pool(PoolSpec("p", 1), MemoryLimitStore(CLOCK))
    lane = Lane("promised", queue_size=10, max_queue_age_s=5, ttft_slo_s=1.0)
    dispatcher = dispatcher_for([lane], pool)
    holder = call(lane=lane)
    grant = await dispatcher.acquire(holder)
    queued = [
        asyncio.create_task(
            dispatcher.acquire(dataclasses.replace(call(lane=lane), client_retries=1))
        )
        for _ in range(3)
    ]
    await settle()
    dispatcher.dispatch_interval_s = 0.5
    newcomer = asyncio.create_task(
        dispatcher.acquire(dataclasses.replace(call(lane=lane), client_retries=retries))
    )
    await settle()
    assert newcomer.done() == refused
    if refused:
        assert isinstance(newcomer.exception(), GatewayError)
    for task in [*queued, newcomer]:
        task.cancel()
    await dispatcher.release(grant, holder)
