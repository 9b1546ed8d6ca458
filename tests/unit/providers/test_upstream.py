"""The hot path's HTTP client (`providers.upstream`) through `Transport`, against small
real servers on 127.0.0.1 that answer as each test scripts them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sluicegate.core.errors import GatewayError, Upstream
from sluicegate.core.types import Deployment, Timeouts
from sluicegate.providers.base import classify_status
from sluicegate.providers.transport import Transport
from sluicegate.providers.upstream import MAX_HEAD_BYTES, MAX_HEADERS, header_lines, split

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

JSON = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body, off the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


class Backend:
    """A server that answers each request with the next of `answers` (the last one
    repeats), counting connections and noting when each one ends."""

    def __init__(self, *answers: bytes | Answer) -> None:
        self.answers = answers
        self.served = 0
        self.connections = 0
        self.closed = 0
        self.requests: list[bytes] = []
        self.closed_one = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                answer = self.answers[min(self.served, len(self.answers) - 1)]
                self.served += 1
                if callable(answer):
                    await answer(reader, writer)
                    continue
                self.requests.append(await request(reader))
                writer.write(answer)
                await writer.drain()
        self.closed += 1
        self.closed_one.set()
        writer.close()


@contextlib.asynccontextmanager
async def serving(
    backend: Backend, streamed_read_s: float = 5.0, **fields: object
) -> AsyncIterator[Transport]:
    server = await asyncio.start_server(backend.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    deployment = Deployment(
        "d", "openai", f"http://127.0.0.1:{port}/v1", "m", None,
        Timeouts(1, streamed_read_s, 10), 8, ("p",), cancel_grace_s=0,
    )  # fmt: skip
    transport = Transport(dataclasses.replace(deployment, **fields), {"authorization": "k"})
    await transport.start()
    try:
        async with server:
            yield transport
    finally:
        await transport.close()


def url(transport: Transport) -> str:
    return transport.deployment.base_url + "/chat/completions"


async def call(transport: Transport, streamed: bool = False, budget_s: float = 5) -> bytes | str:
    """The body of one call, or the code of the error it raised."""
    try:
        async with transport.post(
            url(transport), b'{"a":1}', budget_s, classify_status, streamed
        ) as body:
            return await body.read()
    except GatewayError as exc:
        return exc.code


async def test_a_connection_is_reused_after_a_complete_answer():
    backend = Backend(JSON)
    async with serving(backend) as transport:
        assert [await call(transport) for _ in range(3)] == [b"{}"] * 3
    assert backend.connections == 1


async def test_the_request_carries_its_head_fixed_headers_and_body():
    backend = Backend(JSON)
    async with serving(backend) as transport:
        await call(transport)
    head, _, body = backend.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert {b"authorization: k", b"accept-encoding: identity", b"content-length: 7"} <= set(lines)
    assert body == b'{"a":1}'


async def test_a_header_value_with_a_line_break_is_refused():
    with pytest.raises(ValueError, match="line break"):
        header_lines({"x-request-id": "a\r\nx-evil: 1"})


def test_a_url_with_credentials_is_refused_rather_than_sent_without_them():
    with pytest.raises(ValueError, match="credentials"):
        split("https://user:secret@api.example.com/v1")


async def test_the_pool_holds_at_most_max_connections_and_serves_waiters_in_order():
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        await release.wait()
        writer.write(JSON)

    backend = Backend(slow)
    order: list[int] = []
    async with serving(backend, max_connections=1) as transport:

        async def one(number: int) -> None:
            assert await call(transport) == b"{}"
            order.append(number)

        tasks = []
        for number in range(4):
            tasks.append(asyncio.create_task(one(number)))
            await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(*tasks)
    assert backend.connections == 1
    assert order == [0, 1, 2, 3]


async def test_a_caller_waiting_for_a_full_pool_gives_up_after_connect_s():
    release = asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        await release.wait()
        writer.write(JSON)

    backend = Backend(held, JSON)
    async with serving(backend, max_connections=1, timeouts=Timeouts(0.1, 5, 10)) as transport:
        first = asyncio.create_task(call(transport))
        await asyncio.sleep(0.01)
        assert await call(transport) == Upstream.TIMEOUT
        release.set()
        assert await first == b"{}"
        assert await call(transport) == b"{}"
    assert backend.connections == 1


async def test_a_caller_cancelled_as_a_connection_is_handed_to_it_gives_it_back():
    backend = Backend(JSON)
    async with serving(backend, max_connections=1, timeouts=Timeouts(0.5, 5, 10)) as transport:
        async with transport.post(url(transport), b"{}", 5, classify_status, False) as body:
            waiting = asyncio.create_task(call(transport))
            await asyncio.sleep(0.01)
            assert await body.read() == b"{}"
        # Leaving the block handed the connection to the waiting caller, not yet woken.
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await call(transport) == b"{}"
    assert backend.connections == 1


async def test_an_answer_left_unfinished_closes_its_connection():
    backend = Backend(SSE_HEAD + chunk(b"data: 1\n\n"), JSON)
    async with serving(backend) as transport:
        async with transport.post(url(transport), b"{}", 5, classify_status, True) as body:
            assert await anext(body.chunks()) == b"data: 1\n\n"
        await asyncio.wait_for(backend.closed_one.wait(), 5)
        assert await call(transport) == b"{}"
    assert backend.connections == 2


async def test_a_cancelled_call_closes_its_connection():
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        writer.write(SSE_HEAD)
        await reader.read()

    backend = Backend(endless)
    async with serving(backend) as transport:
        task = asyncio.create_task(call(transport, streamed=True))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.wait_for(backend.closed_one.wait(), 5)
    assert backend.closed == 1


async def test_an_idle_connection_is_closed_after_idle_connection_s_unasked():
    backend = Backend(JSON)
    async with serving(backend, idle_connection_s=0.05) as transport:
        assert await call(transport) == b"{}"
        await asyncio.wait_for(backend.closed_one.wait(), 5)
        assert await call(transport) == b"{}"
    assert backend.connections == 2


async def test_a_chunked_answer_arrives_whole_and_its_connection_is_reused():
    answer = SSE_HEAD + chunk(b"data: 1\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    backend = Backend(answer)
    async with serving(backend) as transport:
        first, second = await call(transport, True), await call(transport, True)
    assert first == second == b"data: 1\n\ndata: [DONE]\n\n"
    assert backend.connections == 1


async def test_chunks_that_arrive_together_are_read_as_one_part():
    """However finely the upstream frames its bytes, the gateway relays what arrived at
    once in one piece: a send per piece would cost a write each."""
    events = [b"data: %d\n\n" % n for n in range(5)]
    answer = SSE_HEAD + b"".join(chunk(e) for e in events) + b"0\r\n\r\n"
    async with (
        serving(Backend(answer)) as transport,
        transport.post(url(transport), b"{}", 5, classify_status, True) as body,
    ):
        parts = [part async for part in body.chunks()]
    assert parts == [b"".join(events)]


async def test_an_interim_answer_is_passed_over():
    backend = Backend(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + JSON)
    async with serving(backend) as transport:
        assert [await call(transport), await call(transport)] == [b"{}", b"{}"]
    assert backend.connections == 1


async def test_a_body_that_ends_with_its_connection_is_whole_and_not_reused():
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{}")
        await writer.drain()
        writer.close()
        raise ConnectionError

    backend = Backend(until_close)
    async with serving(backend) as transport:
        assert [await call(transport), await call(transport)] == [b"{}", b"{}"]
    assert backend.connections == 2


async def test_a_content_length_longer_than_the_body_is_an_interruption():
    async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n{}"
        )
        await writer.drain()
        writer.close()
        raise ConnectionError

    async with serving(Backend(short)) as transport:
        assert await call(transport) == Upstream.INTERRUPTED


async def test_bytes_past_the_content_length_spoil_the_connection():
    backend = Backend(JSON + b"HTTP/1.1 200 OK\r\n", JSON)
    async with serving(backend) as transport:
        assert [await call(transport), await call(transport)] == [b"{}", b"{}"]
    assert backend.connections == 2


async def test_bytes_sent_unasked_to_an_idle_connection_spoil_it():
    async def then_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        writer.write(JSON)
        await asyncio.sleep(0.05)
        writer.write(b"surprise")

    backend = Backend(then_garbage, JSON)
    async with serving(backend) as transport:
        assert await call(transport) == b"{}"
        await asyncio.wait_for(backend.closed_one.wait(), 5)
        assert await call(transport) == b"{}"
    assert backend.connections == 2


async def test_a_never_ending_stream_is_cut_at_the_calls_deadline():
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        writer.write(SSE_HEAD)
        while True:
            writer.write(chunk(b": keep-alive\n\n"))
            await writer.drain()
            await asyncio.sleep(0.02)

    async with serving(Backend(trickle), streamed_read_s=1) as transport:
        assert await call(transport, streamed=True, budget_s=0.3) == Upstream.TIMEOUT


async def test_a_stream_that_goes_quiet_is_cut_after_read_s():
    async def quiet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        writer.write(SSE_HEAD + chunk(b"data: 1\n\n"))
        await reader.read()

    async with serving(Backend(quiet), streamed_read_s=0.1) as transport:
        async with asyncio.timeout(5):
            assert await call(transport, streamed=True, budget_s=30) == Upstream.TIMEOUT


async def test_a_non_streamed_answer_is_not_bound_by_read_s():
    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        await asyncio.sleep(0.3)
        writer.write(JSON)

    async with serving(Backend(late), streamed_read_s=0.05) as transport:
        assert await call(transport) == b"{}"


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\n" + b"x-a: b\r\n" * (MAX_HEADERS + 1) + b"content-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-long: " + b"a" * MAX_HEAD_BYTES,
        b"HTTP/1.1 200 OK\r\nx-bad header\r\n\r\n",
    ],
    ids=["too many headers", "a head over the bound", "unparsable"],
)
async def test_a_broken_or_oversized_head_makes_the_upstream_unreachable(head: bytes):
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request(reader)
        writer.write(head)
        await reader.read()

    async with serving(Backend(answer)) as transport:
        async with asyncio.timeout(5):
            assert await call(transport) == Upstream.UNREACHABLE


async def test_a_lagging_reader_stops_the_socket_being_read():
    """The server cannot write a large body faster than the consumer takes it: the
    client holds a bounded amount and lets the kernel's buffers push back."""
    total = 64 * 1024 * 1024
    written = 0

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        await request(reader)
        writer.write(SSE_HEAD)
        piece = chunk(b"x" * 65536)
        while written < total:
            writer.write(piece)
            await writer.drain()
            written += 65536
        writer.write(b"0\r\n\r\n")
        await reader.read()

    async with (
        serving(Backend(flood)) as transport,
        transport.post(url(transport), b"{}", 30, classify_status, True) as body,
    ):
        chunks = body.chunks()
        received = len(await anext(chunks))
        await asyncio.sleep(0.3)
        assert written < total / 2
        async for part in chunks:
            received += len(part)
    assert written == received == total


async def test_an_https_url_is_called_over_tls_naming_its_host():
    """The server only looks at the client's first bytes: a TLS ClientHello naming the
    host (SNI); its failed handshake leaves the deployment unreachable."""
    hello = asyncio.get_running_loop().create_future()

    async def handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello.set_result(await reader.read(4096))
        writer.close()
        raise ConnectionError

    backend = Backend(handshake)
    async with serving(backend) as plain:
        port = plain.deployment.base_url.rsplit(":", 1)[1]
        deployment = dataclasses.replace(plain.deployment, base_url=f"https://localhost:{port}")
        transport = Transport(deployment, {})
        await transport.start()
        try:
            assert await call(transport) == Upstream.UNREACHABLE
        finally:
            await transport.close()
    first = hello.result()
    assert first[:1] == b"\x16"
    assert b"localhost" in first
