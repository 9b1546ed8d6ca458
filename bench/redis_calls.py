"""CPU and wall time of one script call to Redis, three ways, back to back in one run:
redis-py's asyncio client, the limit store's own connection (`stores/resp.py`), and a
bare asyncio protocol (the floor: one write, one read, one parse). Then what the
store's pool decision costs a streamed request with and without its prefill part (the
budget's count at the decision and the prompt's end at its first token), each
decision given back as a request's end would.

    .venv/bin/python bench/redis_calls.py [--calls N]

Needs Redis on 127.0.0.1:6379 (or SLUICEGATE_BENCH_REDIS_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import secrets
import time
from collections.abc import Awaitable, Callable

import hiredis
import uvloop
from redis.asyncio import Redis

from sluicegate.core import keys
from sluicegate.core.limits import (
    Ask,
    Charge,
    GiveBack,
    Lease,
    Prefill,
    PrefillEnd,
    Rate,
    Slot,
)
from sluicegate.stores.redis import RedisLimitStore
from sluicegate.stores.resp import RespConnection

REDIS_URL = os.environ.get("SLUICEGATE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SCRIPT = "return #KEYS + #ARGV"
KEYS = ("{pools}pool:a:slots", "{pools}pool:a:requests", "{pools}pool:a:tokens")
ARGS = ("", "owner:123", 30.0, 0, 1, 64, 0.001, 0.06, 12, 1e9)


class _Bare(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: asyncio.Future[object] | None = None

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        if (reply := self.reader.gets()) is not False and self.waiting is not None:
            self.waiting.set_result(reply)


async def measure(name: str, call: Callable[[], Awaitable[object]], calls: int) -> None:
    for _ in range(200):
        await call()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        await call()
    cpu_us = (time.process_time() - cpu) / calls * 1e6
    wall_us = (time.perf_counter() - wall) / calls * 1e6
    print(f"{name:28} CPU {cpu_us:6.1f} us, wall {wall_us:6.1f} us per call")


async def main(calls: int) -> None:
    client = Redis.from_url(REDIS_URL)
    sha = await client.script_load(SCRIPT)
    await measure("redis-py Redis.evalsha", lambda: client.evalsha(sha, 3, *KEYS, *ARGS), calls)
    own = RespConnection(REDIS_URL, 1.0)
    await measure(
        "stores/resp.py connection", lambda: own.call("EVALSHA", sha, 3, *KEYS, *ARGS), calls
    )
    loop = asyncio.get_running_loop()
    transport, bare = await loop.create_connection(_Bare, "127.0.0.1", 6379)
    command = b"*2\r\n$4\r\nPING\r\n$1\r\nx\r\n"

    async def ping() -> object:
        bare.waiting = loop.create_future()
        transport.write(command)
        return await bare.waiting

    await measure("bare protocol (PING)", ping, calls)
    transport.close()
    await own.close()
    await decisions(client, calls)
    await client.aclose()


async def decisions(client: Redis, calls: int) -> None:
    """A pool decision and its give-back, then the same with the prompt counted in the
    deployment's prefill budget and ended at its first token, under a prefix of the
    run's own, deleted after."""
    prefix = f"sluicegate-bench:{secrets.token_hex(4)}:"
    store = RedisLimitStore(RespConnection(REDIS_URL, 1.0), prefix, 1.0)
    slot = keys.pool_slots("a")
    rate = Rate(limit=1e9, period_s=60, burst=1e9)
    ask = Ask(slots=(Slot(slot, 64),), charges=(Charge(keys.pool_requests("a"), rate, 1),))
    budget = keys.prefill("a")
    counted = ask._replace(prefill=Prefill(budget, 1_000, 1.0))
    ids = itertools.count()

    async def request(prefilled: bool) -> None:
        lease = Lease(f"bench:{next(ids)}", (slot,))
        await store.take(counted if prefilled else ask, lease, 30.0)
        if prefilled:
            await store.prefilled([PrefillEnd(budget, lease.id, True)])
        await store.give_back([GiveBack(lease)])

    try:
        await measure("pool decision + give-back", lambda: request(False), calls)
        await measure("... + prefill part and end", lambda: request(True), calls)
    finally:
        await store.close()
        found = [key async for key in client.scan_iter(match=f"{prefix}*")]
        if found:
            await client.delete(*found)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    uvloop.run(main(parser.parse_args().calls))
