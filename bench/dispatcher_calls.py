"""Python calls per acquire and release of the dispatcher alone (one lane, one target, a
pool of 64, VTC), counted by cProfile over 2,000 requests after 200 to warm up.

    PYTHONPATH=/tmp/start/src .venv/bin/python bench/dispatcher_calls.py plain
    .venv/bin/python bench/dispatcher_calls.py stream
"""

import asyncio
import cProfile
import pstats
import sys

from sluicegate.capacity.breaker import Breaker
from sluicegate.capacity.gates import OpenGate
from sluicegate.capacity.pools import Pool
from sluicegate.core.call import Call
from sluicegate.core.clock import MonotonicClock
from sluicegate.core.leases import Leases
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
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.fairness import VirtualTokenCounter
from sluicegate.stores.memory import MemoryLimitStore

STREAM = sys.argv[1] == "stream"
N = 2000


async def main() -> None:
    clock = MonotonicClock()
    lane = Lane("default")
    dep = Deployment("d", "openai", "http://x/v1", "m", None, Timeouts(1, 1, 1), 8, ("p",))
    pool = Pool(PoolSpec("p", 64), Leases(MemoryLimitStore(clock), clock))
    t = Target(dep, (pool,), OpenGate(), Breaker(BreakerPolicy(), clock))
    d = Dispatcher("m", [lane], [t], lambda lane: VirtualTokenCounter(), clock)

    async def one() -> None:
        now = clock.now()
        c = Call(
            Endpoint.CHAT,
            Tenant("a", None),
            Model("m", (dep,)),
            RoutePolicy(),
            lane,
            {},
            STREAM,
            now,
            now + 10,
            100,
            116,
        )
        a = Attempt(c)
        await d.acquire(a)
        if STREAM:
            a.first_byte_s = clock.now()
            d.first_token(a, 0.01)
        a.completion_tokens = 16
        a.used_tokens = 116
        a.end(None)
        await d.release(a)

    for _ in range(200):
        await one()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(N):
        await one()
    pr.disable()
    st = pstats.Stats(pr)
    print(sys.argv[1], "calls per request", round(st.total_calls / N, 1))


asyncio.run(main())
