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
the queue (its reply is dropped when it comes). A connection that fails is closed with
every call on it failed as `Unreachable`; one that has sent no reply for `stall_s` while
calls wait on it (a server gone mute, a link black-holed) is closed when a call gives up,
every call still waiting on it failing as `Late`, since all that is known is that their
answers are late; either way the next call opens a new connection.
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
"""Calls waiting on one connection; more fail at once (`Late`) rather than queue without
bound."""


class RespError(Exception):
    """Redis answered with an error (a bug in a script, NOSCRIPT, a read-only replica)."""


class Unreachable(ConnectionError):
    """The connection could not be made or was lost."""


class Late(TimeoutError):
    """No answer can come in time: the connection stalled, or too many calls wait on it.
    A slow server, not a lost one: the caller counts it as a timeout."""


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self._reader = hiredis.Reader(replyError=RespError)
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._transport: asyncio.WriteTransport | None = None
        self.lost: BaseException | None = None
        self._quiet_since = 0.0
        """Since when calls wait without a reply (loop time): the later of the last reply
        and the send that found nothing waiting."""
        self._outgoing: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        self._quiet_since = asyncio.get_running_loop().time()
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

    def silent_s(self, now: float) -> float:
        """How long calls have waited on this connection without any reply; 0 when none
        waits."""
        return now - self._quiet_since if self._waiting else 0.0

    def abandon(self, why: str) -> None:
        """Close a stalled connection: every call waiting on it fails as `Late`."""
        self.lost = Late(why)
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(Late(why))
        self.close()

    def send(self, command: bytes, at_once: bool) -> asyncio.Future[Any]:
        if self.lost is not None or self._transport is None:
            raise Unreachable("the connection was lost")
        if len(self._waiting) >= MAX_PENDING:
            raise Late(f"{MAX_PENDING} calls already wait on the connection")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._waiting:
            self._quiet_since = loop.time()
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
        self._stall_s = connect_timeout_s if stall_s is None else stall_s
        """The connect bound by default: a connection silent that long costs more than
        opening another would."""
        self._protocol: _Protocol | None = None
        self._opening: asyncio.Future[_Protocol] | None = None

    async def call(self, *args: Any) -> Any:
        """One command's reply; `RespError` for an error reply, `Unreachable` (an
        OSError) when there is no connection, `Late` (a TimeoutError) when it cannot come
        in time. The caller bounds the wait; a call given up while its connection has
        sent no reply for `stall_s` leaves that connection (every call on it fails as
        late; the next call opens another), so a server gone mute is not waited on
        forever. A connection still answering, only late, is kept."""
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
        sent: list[asyncio.Future[Any]] = []
        try:
            for command in commands:
                sent.append(protocol.send(hiredis.pack_command(command), at_once))
            return [await reply for reply in sent]
        except BaseException as exc:
            for reply in sent:
                reply.add_done_callback(_dropped)
            if isinstance(exc, asyncio.CancelledError):
                self._leave_if_stalled(protocol)
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

    def _leave_if_stalled(self, protocol: _Protocol) -> None:
        silent_s = protocol.silent_s(asyncio.get_running_loop().time())
        if silent_s >= self._stall_s:
            protocol.abandon(f"no reply from Redis for {silent_s:.3g}s")
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
