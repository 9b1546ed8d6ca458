"""A Redis that stalls (paused by SIGSTOP: connections stay open, nothing is answered) or
is slow to reach, against a `redis-server` of the test's own: each call it holds is a late
answer, counted toward the three in a row that degrade a replica, never an outage on its
own; a connection slower to open than one call's bound is still made."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sluicegate.app import redis_store
from sluicegate.core.clock import MonotonicClock
from sluicegate.core.limits import Ask, Lease, Slot, StoreTimeout, StoreUnavailable
from sluicegate.core.types import DegradedPolicy, WhenDown
from sluicegate.stores import resp
from sluicegate.stores.failover import FailoverStore
from sluicegate.stores.resp import RespConnection
from tests.support.redis import RedisServer, redis_policy, redis_server

TIMEOUT_S = 0.05
TTL_S = 30.0
POLICY = DegradedPolicy(WhenDown.LOCAL_SHARE, WhenDown.LOCAL_SHARE, 0.5, 1)
ASK = Ask(slots=(Slot("s", 10),))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as started:
        yield started


@pytest.fixture
async def replica(server: RedisServer) -> AsyncIterator[FailoverStore]:
    """A replica's store as `serve` wires it, with every default, connected."""
    policy = redis_policy(server.url)
    assert policy.timeout_s == TIMEOUT_S
    store = FailoverStore(redis_store(policy), MonotonicClock(), POLICY, TTL_S)
    await store.run_once()
    assert not store.degraded
    yield store
    await store.close()


async def take(store: FailoverStore, name: str) -> BaseException | None:
    try:
        refused = await store.take(ASK, Lease(name, ("s",)), TTL_S)
    except StoreUnavailable as exc:
        return exc
    assert refused is None
    return None


async def test_a_pause_fails_the_calls_it_holds_as_late_answers_not_as_an_outage(server, replica):
    """Two calls held by one pause, the second still waiting when the first gives up:
    two late answers, and the replica stays on the shared store."""
    server.pause()
    first = asyncio.ensure_future(take(replica, "a"))
    await asyncio.sleep(TIMEOUT_S / 2)
    second = asyncio.ensure_future(take(replica, "b"))
    outcomes = await asyncio.gather(first, second)
    server.resume()
    assert [type(outcome) for outcome in outcomes] == [StoreTimeout, StoreTimeout]
    assert not replica.degraded
    assert replica.view().timeouts == 2
    assert await take(replica, "c") is None
    assert not replica.degraded


async def test_a_connection_silent_past_its_stall_bound_is_left_and_its_calls_are_late(server):
    """Given up after `stall_s` with no reply since: the connection is closed, every
    call still waiting on it fails as late, and the next call opens another."""
    connection = RespConnection(server.url, 1.0, stall_s=TIMEOUT_S)
    assert await connection.call("PING") == b"PONG"
    server.pause()
    waiting = asyncio.ensure_future(connection.call("PING"))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(2 * TIMEOUT_S):
            await connection.call("PING")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(1.0):
            await waiting
    assert waiting.done()
    server.resume()
    assert await connection.call("PING") == b"PONG"
    await connection.close()


async def test_calls_beyond_the_connection_s_backlog_are_late_answers(server, replica, monkeypatch):
    """Past `MAX_PENDING` calls waiting on the connection, one more fails at once, as a
    late answer: a backlog is a slow store, not a lost one."""
    monkeypatch.setattr(resp, "MAX_PENDING", 1)
    server.pause()
    waiting = asyncio.ensure_future(take(replica, "a"))
    await asyncio.sleep(0)
    began = time.monotonic()
    beyond = await take(replica, "b")
    assert time.monotonic() - began < TIMEOUT_S
    assert type(beyond) is StoreTimeout
    assert type(await waiting) is StoreTimeout
    server.resume()
    assert not replica.degraded


async def delayed_proxy(target_port: int, delay_s: float) -> asyncio.Server:
    """A link to Redis on which each connection's first reply (its set-up: AUTH, as a
    TLS handshake would be) arrives `delay_s` late; everything after at once."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float):
        first = True
        while data := await reader.read(65536):
            if first and delay:
                await asyncio.sleep(delay)
            first = False
            writer.write(data)
        writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(
            pipe(reader, upstream_writer, 0.0),
            pipe(upstream_reader, writer, delay_s),
            return_exceptions=True,
        )

    return await asyncio.start_server(accept, "127.0.0.1", 0)


async def test_a_redis_slower_to_connect_than_a_call_s_bound_is_still_reached(server):
    """Opening a connection is bounded apart from calls (`connect_timeout_s`): a set-up
    taking longer than the default 50 ms call bound ends, and calls are answered."""
    admin = RespConnection(server.url, 1.0)
    await admin.call("ACL", "SETUSER", "gateway", "on", ">s3cret", "~*", "&*", "+@all")
    await admin.close()
    proxy = await delayed_proxy(server.port, 4 * TIMEOUT_S)
    port = proxy.sockets[0].getsockname()[1]
    policy = redis_policy(f"redis://gateway:s3cret@127.0.0.1:{port}/0")
    store = redis_store(policy)
    with pytest.raises(StoreTimeout):
        await store.in_use("s")
    deadline = time.monotonic() + 2.0
    answered = None
    while answered is None and time.monotonic() < deadline:
        try:
            answered = await store.in_use("s")
        except StoreUnavailable:
            await asyncio.sleep(TIMEOUT_S)
    assert answered == 0
    await store.close()
    proxy.close()
