"""Every dispatcher plug-in through the same randomized lifecycles, on a fake clock.

Requests of several tenants arrive in a promised top lane that lower lanes yield to and
a paced lower lane held to half of each pool; each is cancelled at a random stage (while
queued, granted, streaming) or runs to its end with a random outcome, and a stream asked
to give its slot away hands it over and queues its rest. Once every request is over,
whatever any plug-in counted for requests in flight is back at zero, and what it keeps
per tenant, lane or deployment grows with those alone. A plug-in added to the dispatcher
without a line in `HELD` fails the suite. The seeds are drawn at run time and printed
with any failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest

from sluicegate.capacity.breaker import Breaker
from sluicegate.capacity.gates import AimdGate
from sluicegate.capacity.pools import Pool
from sluicegate.core.call import Call
from sluicegate.core.clock import sleep_until
from sluicegate.core.errors import ErrorType, GatewayError
from sluicegate.core.leases import Leases
from sluicegate.core.types import (
    AdaptiveLimit,
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
from sluicegate.core.types import (
    PrefixAffinity as PrefixAffinitySpec,
)
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.checks import BreakerCheck, GateCheck, ShareCheck
from sluicegate.scheduling.demand import Learner
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.fairness import VirtualTokenCounter
from sluicegate.scheduling.handover import Giver, HandOver
from sluicegate.scheduling.pacing import Pacing
from sluicegate.scheduling.placement import Reason
from sluicegate.scheduling.placement.prefix_affinity import PrefixAffinity
from sluicegate.scheduling.prefilling import PrefillBudgets
from sluicegate.scheduling.queueing import QueueRule
from sluicegate.scheduling.reserve import SpareSlots
from sluicegate.scheduling.routing import Routing
from sluicegate.scheduling.stats import Stats
from sluicegate.scheduling.tenants import Tenants
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock

TOP = Lane("top", 100, ttft_slo_s=2.0, queue_size=6, max_queue_age_s=2.0)
LOW = Lane("low", 0, queue_size=6, max_queue_age_s=2.0, max_share=0.5, max_dispatch_rate=40.0)
LANES = (TOP, LOW)
TENANTS = ("a", "b", "c")
BATCH = 4
RUNS = 6
REQUESTS = 60


OUTCOMES = (
    None,
    GatewayError(502, "upstream_error", "failed", ErrorType.UPSTREAM, failover=True),
    GatewayError(400, "invalid_request", "rejected", ErrorType.INVALID_REQUEST),
)
"""An answer, a failure of the deployment, one of the caller's own: mostly answers, so
that circuits stay mostly closed and streams fill the slots."""


def deployment(name: str) -> Deployment:
    spec = Deployment(name, "openai", "http://x/v1", "m", None, Timeouts(1, 1, 1), 8, (name,))
    return dataclasses.replace(spec, resumable=True)


def dispatcher_on(clock: FakeClock) -> Dispatcher:
    leases = Leases(MemoryLimitStore(clock), clock)
    targets = [
        Target(
            deployment(name),
            (Pool(PoolSpec(name, BATCH // 2), leases),),
            AimdGate(AdaptiveLimit(BATCH // 2, 1, BATCH, 1.0, 0.5)),
            Breaker(BreakerPolicy(), clock),
        )
        for name in ("d1", "d2")
    ]
    placement = PrefixAffinity(targets, AFFINITY)
    return Dispatcher(
        "m", LANES, targets, lambda lane: VirtualTokenCounter(), clock, placement=placement
    )


def held_by_targets(dispatcher: Dispatcher, read: Callable[[Target], int]) -> int:
    return sum(read(target) for target in dispatcher.targets)


HELD: dict[type, Callable[[Any, Dispatcher], list[int]]] = {
    BreakerCheck: lambda p, d: [held_by_targets(d, lambda t: t.breaker.in_flight)],
    GateCheck: lambda p, d: [held_by_targets(d, lambda t: t.gate.in_flight)],  # type: ignore[attr-defined]
    ShareCheck: lambda p, d: [sum(p.in_use.values())],
    Pacing: lambda p, d: [],
    PrefillBudgets: lambda p, d: [len(p._seen), *(b.pending for b in p._budgets.values())],
    HandOver: lambda p, d: [
        len(p._streaming),
        len(p._givers),
        len(p._resumable),
        len(p._asked),
        p.rests.count,
    ],
    Stats: lambda p, d: [lane.in_flight for lane in p.lanes.values()],
    Routing: lambda p, d: [],
    Tenants: lambda p, d: [len(p._charged), *(len(f._in_flight) for f in p._fairness.values())],
    QueueRule: lambda p, d: [],
    SpareSlots: lambda p, d: [],
    Learner: lambda p, d: [],
}
"""What each plug-in holds for requests in flight: all zero once none is."""

KEPT: dict[type, Callable[[Any], int]] = {
    Pacing: lambda p: len(p._next_dispatch_s) - len(LANES),
    QueueRule: lambda p: (
        sum(len(shedders) for shedders in p._shedders.values()) - len(LANES) * len(TENANTS)
    ),
    SpareSlots: lambda p: len(p._splits) - (BATCH + 1),
    Learner: lambda p: 0,
    Routing: lambda p: (
        len(p.chosen)
        - 2 * len(Reason)
        + sum(p.placement.view()["index_blocks"].values())
        - 2 * AFFINITY.index_blocks
    ),
}
"""How far what a plug-in keeps exceeds its bound (tenants, lanes, deployments): at most
0."""


PROMPTS = ("a shared system prompt; ", "another application's; ", "a third one's prompt; ")
"""Prompts that share prefixes, so that the prefix index fills and evicts."""
AFFINITY = PrefixAffinitySpec(block_bytes=16, index_blocks=6)


def call(clock: FakeClock, rng: random.Random) -> Call:
    now = clock.now()
    prompt = rng.randint(1, 400)
    return Call(
        Endpoint.CHAT,
        Tenant(rng.choice(TENANTS), None),
        Model("m", ()),
        RoutePolicy(),
        rng.choice(LANES),
        {"messages": [{"role": "user", "content": rng.choice(PROMPTS) * rng.randint(1, 4)}]},
        rng.random() < 0.8,
        now,
        now + rng.uniform(0.5, 5.0),
        prompt,
        prompt + rng.randint(1, 200),
        rng.choice((0, 0, 0, 1)),
    )


async def pause(clock: FakeClock, rng: random.Random) -> None:
    await sleep_until(clock, clock.now() + rng.uniform(0.0, 0.4))


async def life(dispatcher: Dispatcher, clock: FakeClock, rng: random.Random, c: Call) -> None:
    """One request: acquire, then maybe a first token, then an end with a random outcome;
    a stream asked to give its slot away ends there and its rest goes on as a request of
    its own. Cancelled at any await, it releases what it held."""
    attempt = Attempt(c)
    try:
        await dispatcher.acquire(attempt)
    except GatewayError:
        return
    rest: Call | None = None
    giver = Giver()
    try:
        await pause(clock, rng)
        if c.stream and rng.random() < 0.8:
            attempt.first_byte_s = clock.now()
            dispatcher.first_token(attempt, clock.now() - c.arrived_s)
            if not c.resumed:
                giver.interrupt = lambda: rng.random() < 0.8
                dispatcher.may_give(attempt, giver)
            for _ in range(rng.randint(0, 3)):
                await pause(clock, rng)
                giver.relayed_events += rng.randint(1, 5)
                if giver.agreed:
                    produced = giver.relayed_events
                    rest = c._replace(resumed=True, prompt_tokens=c.prompt_tokens + produced)
                    break
        attempt.completion_tokens = giver.relayed_events or None
        if rng.random() < 0.5:
            attempt.used_tokens = c.prompt_tokens + giver.relayed_events
        attempt.end(asyncio.CancelledError() if rest else rng.choices(OUTCOMES, (8, 1, 1))[0])
    except BaseException as err:
        attempt.end(err)
        raise
    finally:
        await dispatcher.release(attempt)
    if rest is not None:
        await life(dispatcher, clock, rng, rest)


async def settle() -> None:
    for _ in range(8):
        await asyncio.sleep(0)


async def run(seed: int) -> Dispatcher:
    """Arrivals over a few seconds, some cancelled at random moments, then the clock runs
    on until every request is over."""
    rng = random.Random(seed)
    clock = FakeClock(start=rng.uniform(0.0, 10_000.0))
    dispatcher = dispatcher_on(clock)
    runner = asyncio.create_task(dispatcher.run())
    tasks: list[asyncio.Task[None]] = []
    try:
        for _ in range(REQUESTS):
            tasks.append(asyncio.create_task(life(dispatcher, clock, rng, call(clock, rng))))
            await settle()
            if rng.random() < 0.2:
                rng.choice(tasks).cancel()
            clock.advance(rng.uniform(0.0, 0.1))
            await settle()
        for _ in range(2000):
            if all(task.done() for task in tasks):
                break
            clock.advance(0.05)
            await settle()
        assert all(task.done() for task in tasks), "requests still running after every bound"
        for task in tasks:
            if not task.cancelled():
                assert task.exception() is None, repr(task.exception())
    finally:
        runner.cancel()
        for task in tasks:
            task.cancel()
    return dispatcher


def plugins(dispatcher: Dispatcher) -> list[Any]:
    return list(dict.fromkeys([*dispatcher.checks, *dispatcher.observers]))


@pytest.mark.parametrize("run_index", range(RUNS))
async def test_every_plugin_holds_nothing_once_every_request_is_over(run_index):
    seed = random.randrange(2**32)
    dispatcher = await run(seed)
    for plugin in plugins(dispatcher):
        held = HELD[type(plugin)](plugin, dispatcher)
        assert all(count == 0 for count in held), (seed, type(plugin).__name__, held)
        if type(plugin) in KEPT:
            assert KEPT[type(plugin)](plugin) <= 0, (seed, type(plugin).__name__)
    assert all(queue.size == 0 for queue in dispatcher.queues.values()), seed
    for queue in dispatcher.queues.values():
        assert not queue.fairness._in_flight, (seed, queue.lane.name)  # type: ignore[attr-defined]
    for target in dispatcher.targets:
        assert all(pool.counters.active == 0 for pool in target.pools), seed


def test_every_plugin_of_a_dispatcher_is_in_the_suite():
    dispatcher = dispatcher_on(FakeClock())
    missing = [type(p).__name__ for p in plugins(dispatcher) if type(p) not in HELD]
    assert not missing
