"""The upstream connection pool: an idle connection is closed by the gateway before the
backend would close it, so a request is never sent into a connection closing under it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sluicegate.core.errors import GatewayError, Upstream
from sluicegate.core.types import Deployment, Timeouts
from sluicegate.providers.base import classify_status
from sluicegate.providers.transport import Transport

BACKEND_KEEP_ALIVE_S = 0.4
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class ClosingBackend:
    """Answers on keep-alive connections, and closes one that stayed idle for its
    keep-alive as a request arrives on it: the race a pooled client loses when it keeps
    a connection longer than the server does, made certain."""

    def __init__(self) -> None:
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if loop.time() - idle_since >= BACKEND_KEEP_ALIVE_S:
                    break
                length = next(
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                await reader.readexactly(length)
                writer.write(ANSWER)
                await writer.drain()
                idle_since = loop.time()
        writer.close()


@contextlib.asynccontextmanager
async def backend() -> AsyncIterator[tuple[ClosingBackend, str]]:
    closing = ClosingBackend()
    server = await asyncio.start_server(closing.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield closing, f"http://127.0.0.1:{port}/v1"


async def post_twice(idle_connection_s: float) -> tuple[list[str], ClosingBackend]:
    """Two calls a little more than the backend's keep-alive apart; what each got."""
    outcomes: list[str] = []
    async with backend() as (closing, base_url):
        deployment = Deployment(
            "d", "openai", base_url, "m", None, Timeouts(2, 2, 2), 8, ("p",),
            idle_connection_s=idle_connection_s,
        )  # fmt: skip
        transport = Transport(deployment, {})
        await transport.start()
        url = f"{base_url}/chat/completions"
        try:
            for pause_s in (0.0, BACKEND_KEEP_ALIVE_S + 0.2):
                await asyncio.sleep(pause_s)
                try:
                    async with transport.post(url, b"{}", 2, classify_status, False) as body:
                        outcomes.append((await body.read()).decode())
                except GatewayError as exc:
                    outcomes.append(exc.code)
        finally:
            await transport.close()
    return outcomes, closing


async def test_an_idle_connection_is_closed_before_the_backend_closes_it():
    outcomes, closing = await post_twice(idle_connection_s=BACKEND_KEEP_ALIVE_S / 2)
    assert outcomes == ["{}", "{}"]
    assert closing.connections == 2


async def test_a_connection_kept_past_the_backends_keep_alive_fails_the_call():
    """The same two calls with the pool keeping connections longer than the backend:
    the second is sent into the connection the backend closes."""
    outcomes, closing = await post_twice(idle_connection_s=30.0)
    assert outcomes == ["{}", Upstream.UNREACHABLE]
    assert closing.connections == 1
