from __future__ import annotations

import asyncio

import orjson
import pytest

from sluicegate.api.asgi import (
    ClientDisconnected,
    DisconnectWatcher,
    Router,
    error_headers,
    read_body,
    send_error,
)
from sluicegate.core.errors import ErrorType, GatewayError


def refusal(**kwargs) -> GatewayError:
    return GatewayError(429, "tenant_rate_limited", "slow down", ErrorType.RATE_LIMIT, **kwargs)


def test_retry_after_is_whole_seconds_rounded_up_with_milliseconds_beside_it():
    headers = dict(error_headers(refusal(retry_after_s=1.2)))
    assert headers[b"retry-after"] == b"2"
    assert headers[b"retry-after-ms"] == b"1200"


def test_no_retry_after_without_a_known_time():
    headers = dict(error_headers(refusal()))
    assert b"retry-after" not in headers
    assert b"retry-after-ms" not in headers


def test_should_retry_header_only_when_decided():
    assert dict(error_headers(refusal(should_retry=False)))[b"x-should-retry"] == b"false"
    assert b"x-should-retry" not in dict(error_headers(refusal()))


async def test_error_is_openai_shaped():
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await send_error(send, refusal())
    assert sent[0]["status"] == 429
    assert orjson.loads(sent[1]["body"]) == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": None,
            "code": "tenant_rate_limited",
        }
    }


def receiver(*messages: dict):
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return receive


async def test_read_body_joins_chunks_and_refuses_past_the_limit():
    body = await read_body(
        receiver(
            {"type": "http.request", "body": b"ab", "more_body": True},
            {"type": "http.request", "body": b"cd"},
        ),
        limit=4,
    )
    assert body == b"abcd"
    with pytest.raises(GatewayError) as info:
        await read_body(
            receiver(
                {"type": "http.request", "body": b"abc", "more_body": True},
                {"type": "http.request", "body": b"de"},
            ),
            limit=4,
        )
    assert info.value.status == 413


async def test_read_body_stops_with_a_timeout_once_the_rest_is_late():
    parts = receiver(
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
    )
    checks = iter([False, True])
    async with asyncio.timeout(2):  # without the check, the third receive waits
        with pytest.raises(TimeoutError):
            await read_body(parts, limit=10, late=lambda: next(checks))


async def test_disconnect_watcher_cancels_the_owner_and_reports_it():
    gate = asyncio.Event()

    async def receive():
        await gate.wait()
        return {"type": "http.disconnect"}

    async def owner():
        async with DisconnectWatcher(receive):
            gate.set()
            await asyncio.sleep(5)

    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(owner(), 2)


class WatchedConnection:
    """The part of the server's `Connection` a watcher uses: it calls back once lost."""

    def __init__(self, lost: bool = False) -> None:
        self.lost = lost
        self.on_lost = None

    def watch(self, on_lost):
        if on_lost is not None and self.lost:
            on_lost()
            return
        self.on_lost = on_lost

    def lose(self) -> None:
        self.lost = True
        if self.on_lost is not None:
            self.on_lost()


async def test_a_watcher_given_the_connection_cancels_on_its_loss_without_a_task():
    connection = WatchedConnection()
    before = len(asyncio.all_tasks())

    async def owner():
        async with DisconnectWatcher(receiver(), connection):
            assert len(asyncio.all_tasks()) == before + 1  # the owner alone
            asyncio.get_running_loop().call_soon(connection.lose)
            await asyncio.sleep(5)

    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(asyncio.create_task(owner()), 2)
    assert connection.on_lost is None


async def test_a_watcher_entered_after_the_loss_cancels_at_once():
    async def owner():
        async with DisconnectWatcher(receiver(), WatchedConnection(lost=True)):
            await asyncio.sleep(5)

    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(owner(), 2)


async def test_a_watcher_stops_watching_the_connection_when_its_block_ends():
    connection = WatchedConnection()
    async with DisconnectWatcher(receiver(), connection):
        assert connection.on_lost is not None
    assert connection.on_lost is None
    connection.lose()
    await asyncio.sleep(0)


async def test_disconnect_watcher_is_silent_when_the_client_stays():
    async with DisconnectWatcher(receiver()):
        await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_router_answers_unknown_paths_and_methods():
    router = Router()

    async def ok(scope, receive, send):
        await send({"type": "done"})

    router.add("GET", "/x", ok)
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    for method, path in (("GET", "/nope"), ("POST", "/x"), ("GET", "/x")):
        await router({"type": "http", "method": method, "path": path}, receiver(), send)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [404, 405]
    assert sent[-1] == {"type": "done"}
