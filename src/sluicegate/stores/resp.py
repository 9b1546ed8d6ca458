"""One multiplexed connection to Redis for the limit store's scripts: the hot path's client.

redis-py's asyncio client takes a pooled connection per command and runs each through
its retry, observability and parsing layers: on this project's 2-core machine it costs
2.2-2.4x the CPU of this connection per script call (`bench/redis_calls.py`), and a
request that passes every gate makes three calls on its path and gives back with two
more (sent in one write). Redis answers the commands of one connection in order, so one
connection carries every concurrent call: each call writes its command and waits for
the reply in its place in the queue. Replies are parsed by hiredis; URLs are parsed by
redis-py, which still serves the release subscription.

Every call is bounded by the caller's timeout. A call that timed out keeps its place in
the queue (its reply is dropped when it comes); a connection that fails, or that sent
no reply at all since a call given up after `stall_s` began, is closed with
every call on it failed, and the next call opens a new one.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.connection import SSLConnection, parse_url

MAX_PENDING = 10_000
"""Calls waiting on one connection; more fail at once rather than queue without bound."""


class RespError(Exception):
    """Redis answered with an error (a bug in a script, NOSCRIPT, a read-only replica)."""


class Unreachable(ConnectionError):
    """The connection could not be made or was lost."""


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self._reader = hiredis.Reader(replyError=RespError)
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._transport: asyncio.WriteTransport | None = None
        self.lost: BaseException | None = None
        self.replied_at = float("-inf")
        """When the last reply came (loop time); never, at first."""
        self._outgoing: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        self.replied_at = asyncio.get_running_loop().time()
        while (reply := self._reader.gets()) is not False:
            future = self._waiting.popleft()
            if future.done():
                continue
            if isinstance(reply, RespError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or Unreachable("the connection was closed")
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(Unreachable(str(self.lost)))

    @property
    def pending(self) -> int:
        return len(self._waiting)

    def send(self, command: bytes, at_once: bool) -> asyncio.Future[Any]:
        if self.lost is not None or self._transport is None:
            raise Unreachable("the connection was lost")
        if len(self._waiting) >= MAX_PENDING:
            raise Unreachable(f"{MAX_PENDING} calls already wait on the connection")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        idle = at_once and not self._waiting and not self._outgoing
        self._waiting.append(future)
        if idle:
            self._transport.write(command)
            return future
        if not self._outgoing:
            loop.call_soon(self._flush)
        self._outgoing.append(command)
        return future

    def _flush(self) -> None:
        """While calls are in flight, every command of one loop turn leaves in one write:
        a system call each costs more than the rest of the call on a busy machine. On an
        idle connection a command leaves at once, since waiting a turn costs latency,
        unless nobody waits for it."""
        outgoing, self._outgoing = self._outgoing, []
        if self._transport is not None and self.lost is None:
            self._transport.write(b"".join(outgoing))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class RespConnection:
    """Calls to one Redis over one connection, opened on first use and after a loss."""

    def __init__(self, url: str, connect_timeout_s: float, stall_s: float | None = None) -> None:
        options = parse_url(url)
        self._path: str | None = options.get("path")
        self._host = options.get("host", "127.0.0.1")
        self._port = int(options.get("port", 6379))
        self._tls: ssl.SSLContext | None = None
        if options.get("connection_class") is SSLConnection:
            self._tls = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
            """Verified against the system's CAs, or the bundle named by `ssl_ca_certs` in
            the URL's query (redis-py's name): built once, it reads files."""
        self._hello: list[list[Any]] = []
        if options.get("password") is not None:
            user = options.get("username")
            password = options["password"]
            self._hello.append(["AUTH", password] if user is None else ["AUTH", user, password])
        if options.get("db"):
            self._hello.append(["SELECT", options["db"]])
        self._connect_timeout_s = connect_timeout_s
        self._stall_s = connect_timeout_s / 2 if stall_s is None else stall_s
        """Half the callers' bound by default: their timeout counts from before the call
        began (and may include connecting), so the whole bound could never be seen."""
        self._protocol: _Protocol | None = None
        self._opening: asyncio.Future[_Protocol] | None = None

    async def call(self, *args: Any) -> Any:
        """One command's reply; `RespError` for an error reply, `Unreachable` (an
        OSError) when there is no connection. The caller bounds the wait; a call given
        up after `stall_s` without any reply on its connection since it began leaves
        that connection (every call on it fails; the next call opens another), so a
        server gone mute is not waited on forever. A connection still answering, only
        late, is kept."""
        return (await self.calls((args,)))[0]

    async def calls(self, commands: Sequence[tuple[Any, ...]], at_once: bool = True) -> list[Any]:
        """Every command's reply, as `call`; the commands are queued in order before
        anything is awaited (on an open connection) and leave together: in the loop
        turn's one write, or the first at once when its caller waits for it (`at_once`)
        on an idle connection. The first error reply raises; the replies after it are
        dropped."""
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            protocol = await self._open()
        began = asyncio.get_running_loop().time()
        sent: list[asyncio.Future[Any]] = []
        try:
            for command in commands:
                sent.append(protocol.send(hiredis.pack_command(command), at_once))
            return [await reply for reply in sent]
        except BaseException as exc:
            for reply in sent:
                reply.add_done_callback(_dropped)
            if isinstance(exc, asyncio.CancelledError):
                self._leave_if_stalled(protocol, began)
            raise

    async def _open(self) -> _Protocol:
        """One opening at a time: concurrent callers wait for the same one. It is shielded
        so that a caller's timeout does not abandon a half-made connection."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect())
            self._opening.add_done_callback(self._opened)
        return await asyncio.shield(self._opening)

    def _opened(self, opening: asyncio.Future[_Protocol]) -> None:
        self._opening = None
        if not opening.cancelled() and opening.exception() is None:
            self._protocol = opening.result()

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                if self._path is not None:
                    _, protocol = await loop.create_unix_connection(_Protocol, self._path)
                else:
                    _, protocol = await loop.create_connection(
                        _Protocol, self._host, self._port, ssl=self._tls
                    )
                try:
                    for command in self._hello:
                        await protocol.send(hiredis.pack_command(tuple(command)), True)
                except BaseException:
                    protocol.close()
                    raise
        except RespError as exc:
            raise Unreachable(f"Redis refused the connection's set-up: {exc}") from None
        except TimeoutError:
            raise Unreachable(f"no connection within {self._connect_timeout_s}s") from None
        except OSError as exc:
            raise Unreachable(str(exc)) from None
        return protocol

    def _leave_if_stalled(self, protocol: _Protocol, began: float) -> None:
        now = asyncio.get_running_loop().time()
        if now - began >= self._stall_s and protocol.replied_at <= began and protocol.pending:
            protocol.close()
            if self._protocol is protocol:
                self._protocol = None

    async def close(self) -> None:
        """Close the connection, and one still being opened once it is made."""
        if self._opening is not None:
            self._opening.add_done_callback(_close_opened)
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None


def _close_opened(opening: asyncio.Future[_Protocol]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _dropped(reply: asyncio.Future[Any]) -> None:
    """Collect a reply nobody awaits any more, so that its error is not reported."""
    if not reply.cancelled():
        reply.exception()
