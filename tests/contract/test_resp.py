"""The limit store's own Redis connection against a real `redis-server` of the test's
own: replies matched to calls in order however many wait, error replies raised, ACL
credentials from the URL, TLS (`rediss://`), scripts loaded again after a restart, a
lost connection failing its calls and replaced by the next one, a mute server left."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.core.limits import Ask, GiveBack, Lease, Slot, StoreTimeout, StoreUnavailable
from sluicegate.stores.redis import RedisLimitStore, listener
from sluicegate.stores.resp import RespConnection, RespError, Unreachable
from tests.support.redis import RedisServer, redis_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as started:
        yield started


async def test_concurrent_calls_each_get_their_own_reply(server, caplog):
    connection = RespConnection(server.url, 1.0)
    replies = await asyncio.gather(*(connection.call("ECHO", f"n{i}") for i in range(500)))
    assert replies == [f"n{i}".encode() for i in range(500)]
    with pytest.raises(RespError, match="unknown command"):
        await connection.call("NO-SUCH-COMMAND")
    assert await connection.call("PING") == b"PONG"
    together = [("ECHO", "a"), ("ECHO", "b")]
    assert await connection.calls(together, at_once=False) == [b"a", b"b"]
    failed = ""
    try:
        await connection.calls([("ECHO", "a"), ("NO-SUCH-COMMAND",), ("NO-SUCH-EITHER",)])
    except RespError as exc:
        failed = str(exc)
    assert "unknown command 'NO-SUCH-COMMAND'" in failed
    assert await connection.call("ECHO", "d") == b"d"
    gc.collect()
    assert "never retrieved" not in caplog.text
    await connection.close()


async def test_acl_user_and_password_and_database_come_from_the_url(server):
    admin = RespConnection(server.url, 1.0)
    await admin.call("ACL", "SETUSER", "gateway", "on", ">s3cret", "~*", "&*", "+@all")
    user = RespConnection(f"redis://gateway:s3cret@127.0.0.1:{server.port}/3", 1.0)
    await user.call("SET", "k", "v")
    assert await user.call("ACL", "WHOAMI") == b"gateway"
    assert await admin.call("GET", "k") is None
    wrong = RespConnection(f"redis://gateway:nope@127.0.0.1:{server.port}/0", 1.0)
    with pytest.raises(Unreachable, match="set-up"):
        await wrong.call("PING")
    for connection in (admin, user, wrong):
        await connection.close()


async def test_rediss_urls_speak_tls_verified_against_the_ca_named_in_the_url(tmp_path):
    """The store's own connection and the release subscription (redis-py) alike; a
    server whose certificate the CA bundle does not vouch for is refused."""
    with redis_server(tmp_path / "tls", tls=True) as server:
        store = RedisLimitStore(RespConnection(server.url, 5.0), "tls:", 5.0)
        subscriber = listener(server.url, 5.0)
        heard: list[str] = []
        watching = asyncio.ensure_future(store.watch_releases(subscriber, heard.append, 0.1))
        store.announce(["s"])
        held = Lease("a", ("s",))
        assert await store.take(Ask(slots=(Slot("s", 1),)), held, 30.0) is None
        assert await store.take(Ask(slots=(Slot("s", 1),)), Lease("b", ("s",)), 30.0)
        await asyncio.sleep(0.3)
        await store.give_back([GiveBack(held)])
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.02)
        assert heard == ["s"]
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await subscriber.aclose()
        await store.close()
        with redis_server(tmp_path / "other", tls=True) as other:
            stranger = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={other.certificate}"
            wrong = RespConnection(stranger, 5.0)
            with pytest.raises(Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
                await wrong.call("PING")
            await wrong.close()


async def test_a_restarted_server_loses_its_scripts_and_the_store_loads_them_again(server):
    store = RedisLimitStore(RespConnection(server.url, 1.0), "t:", 1.0)
    ask = Ask(slots=(Slot("s", 5),))
    assert await store.take(ask, Lease("a", ("s",)), 30) is None
    server.kill()
    with pytest.raises(StoreUnavailable):
        await store.in_use("s")
    server.start()
    assert await store.in_use("s") == 0
    assert await store.take(ask, Lease("b", ("s",)), 30) is None
    assert await store.in_use("s") == 1
    await store.close()


async def test_a_mute_server_is_left_and_the_next_call_reconnects():
    """A peer that accepts and never answers: calls time out, the connection silent for
    `stall_s` is closed, and the next call opens a new one (here: to a peer that
    answers)."""
    answering = asyncio.Event()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            if answering.is_set():
                writer.write(b"+PONG\r\n" * data.count(b"PING"))

    listening = await asyncio.start_server(peer, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    connection = RespConnection(f"redis://127.0.0.1:{port}/0", 1.0, stall_s=0.025)
    store = RedisLimitStore(connection, "x:", 0.05)
    with pytest.raises(StoreTimeout):
        await store.in_use("s")
    answering.set()
    async with asyncio.timeout(5.0):
        assert await connection.call("PING") == b"PONG"
    await store.close()
    listening.close()
    await listening.wait_closed()
