"""What a Redis must be for the fleet's limits, checked at start against a `redis-server`
of the test's own (or a scripted peer, for a version this machine cannot run): 5 or
later, no eviction that could drop a lease set, no Cluster; what the server will not
say (`CONFIG GET` refused, as managed Redis does) is a warning naming the assumption
left unchecked; an unfit Redis stops the start with one line."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.serve import _shared_store_at_start
from sluicegate.stores.redis import inspect
from sluicegate.stores.resp import RespConnection
from tests.support.processes import free_port
from tests.support.redis import RedisServer, redis_policy, redis_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as started:
        yield started


async def configure(server: RedisServer, *settings: str) -> None:
    admin = RespConnection(server.url, 1.0)
    await admin.call("CONFIG", "SET", *settings)
    await admin.close()


async def test_a_plain_redis_is_fit_and_fully_checked(server):
    found = await inspect(server.url)
    assert (found.unreachable, found.unfit, found.unchecked) == (None, None, ())


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "allkeys-lru"])
async def test_a_redis_that_may_evict_the_lease_sets_is_unfit(server, policy):
    """Every key the gateway writes has a TTL: a volatile policy picks them as readily as
    an allkeys one; a lease set evicted is a limit forgotten."""
    await configure(server, "maxmemory", "100mb", "maxmemory-policy", policy)
    found = await inspect(server.url)
    assert found.unfit is not None
    assert f"maxmemory-policy {policy}" in found.unfit
    assert "noeviction" in found.unfit


async def test_eviction_is_fit_with_noeviction_or_without_maxmemory(server):
    await configure(server, "maxmemory", "100mb", "maxmemory-policy", "noeviction")
    assert (await inspect(server.url)).unfit is None
    await configure(server, "maxmemory", "0", "maxmemory-policy", "allkeys-lru")
    assert (await inspect(server.url)).unfit is None


async def test_a_cluster_node_is_unfit(tmp_path):
    # The cluster bus takes the port + 10000 unless told otherwise: past 65535 for a free
    # port above 55535, where the node would not start.
    options = ["--cluster-enabled", "yes", "--cluster-port", str(free_port())]
    with redis_server(tmp_path, options=options) as node:
        found = await inspect(node.url)
    assert found.unfit is not None
    assert "Cluster" in found.unfit


async def test_a_refused_config_get_is_a_warning_naming_the_eviction_assumption(server):
    admin = RespConnection(server.url, 1.0)
    await admin.call("ACL", "SETUSER", "gw", "on", ">pw", "~*", "&*", "+@all", "-config")
    await admin.close()
    found = await inspect(f"redis://gw:pw@127.0.0.1:{server.port}/0")
    assert found.unfit is None
    assert len(found.unchecked) == 1
    assert "eviction" in found.unchecked[0]
    assert "noeviction" in found.unchecked[0]


async def old_redis(version: str) -> asyncio.Server:
    """A peer answering as a Redis of `version` that refuses CONFIG (as managed ones do)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            if b"PING" in data:
                writer.write(b"+PONG\r\n")
            elif b"INFO" in data:
                text = f"# Server\r\nredis_version:{version}\r\n".encode()
                if b"cluster" in data:
                    text = b"# Cluster\r\ncluster_enabled:0\r\n"
                writer.write(b"$%d\r\n%s\r\n" % (len(text), text))
            else:
                writer.write(b"-ERR unknown command 'CONFIG'\r\n")

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_a_redis_older_than_5_is_unfit_and_what_it_refuses_is_unchecked():
    peer = await old_redis("4.0.14")
    port = peer.sockets[0].getsockname()[1]
    found = await inspect(f"redis://127.0.0.1:{port}/0")
    peer.close()
    assert found.unfit is not None
    assert "Redis 4.0.14" in found.unfit
    assert "5 or later" in found.unfit
    assert [line for line in found.unchecked if "eviction" in line]


def test_serve_stops_at_an_unfit_redis_in_one_line_and_warns_of_an_unchecked_one(server, capsys):
    asyncio.run(configure(server, "maxmemory", "100mb", "maxmemory-policy", "volatile-lru"))
    assert _shared_store_at_start(redis_policy(server.url)) is None
    stopped = capsys.readouterr().err
    assert stopped.count("\n") == 1
    assert "maxmemory-policy volatile-lru" in stopped
    assert "not starting" in stopped
    asyncio.run(configure(server, "maxmemory-policy", "noeviction"))
    admin = RespConnection(server.url, 1.0)
    asyncio.run(admin.call("ACL", "SETUSER", "gw", "on", ">pw", "~*", "&*", "+@all", "-config"))
    assert _shared_store_at_start(redis_policy(f"redis://gw:pw@127.0.0.1:{server.port}/0")) is False
    warned = capsys.readouterr().err
    assert "warning" in warned
    assert "unchecked" in warned
