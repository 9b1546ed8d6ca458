"""The real PostgreSQL the store tests use: reachable, or skipped with the reason, except
that CI=true makes its absence a failure."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable

import asyncpg
import pytest

POSTGRES_DSN = os.environ.get(
    "SLUICEGATE_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)


async def connect_or_skip() -> asyncpg.Connection:
    try:
        return await asyncpg.connect(POSTGRES_DSN, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL is not reachable at {POSTGRES_DSN} ({exc!r})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI=true requires it")
        pytest.skip(reason)


class StallingProxy:
    """A TCP relay to PostgreSQL that can stop relaying without closing anything: to the
    gateway, the database has stopped answering mid-statement, as in a network partition
    or a failover that has not finished. It runs its own event loop on a thread, so a
    test blocked starting a process does not stall it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5432) -> None:
        self._target = (host, port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._flowing = asyncio.Event()
        self._server: asyncio.Server | None = None

    def start(self) -> int:
        self._thread.start()
        self._call(self._flowing.set)
        serving = asyncio.start_server(self._relay, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(serving, self._loop).result(5)
        return self._server.sockets[0].getsockname()[1]

    def stall(self) -> None:
        self._call(self._flowing.clear)

    def resume(self) -> None:
        self._call(self._flowing.set)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _shut(self) -> None:
        if self._server is not None:
            self._server.close()
        relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for relay in relays:
            relay.cancel()
        await asyncio.gather(*relays, return_exceptions=True)

    def _call(self, action: Callable[[], object]) -> None:
        self._loop.call_soon_threadsafe(action)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65_536):
                await self._flowing.wait()
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
