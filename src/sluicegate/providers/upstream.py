"""The hot path's HTTP/1.1 client: one connection pool per deployment, one POST per attempt.

Every request the gateway serves makes one upstream call. A general client spends much
of that call on what a call to one known origin never uses (a timer per timeout per
request, a write task, header merging, cookie, redirect and proxy machinery); this
client does only what `Transport` needs, on asyncio protocols and httptools' parser
(the measured difference: docs/benchmarks.md). Calls off the per-request path (backend
metrics, guardrail checkers) keep aiohttp.

Every peer may be hostile: the head's size and header count are bounded, bytes read ahead
of the consumer are bounded (reading pauses), each call has one deadline and a stream a
bound on the gap between reads, and a connection is reused only after a complete
keep-alive answer; any other ends with the connection closed.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from functools import cache
from typing import NamedTuple
from urllib.parse import urlsplit

from httptools import HttpParserError, HttpResponseParser

MAX_HEAD_BYTES = 64 * 1024
"""The status line and headers together; no honest answer comes near it."""
MAX_HEADERS = 100
READ_AHEAD_BYTES = 256 * 1024
"""Body bytes held for a consumer that lags before the socket stops being read."""


class Disconnected(ConnectionError):
    """The upstream closed the connection before its answer was complete."""


class Unparsable(Exception):
    """The answer is not HTTP/1.1 the client can read, or breaks one of its bounds."""


class PoolClosed(ConnectionError):
    """The deployment's pool closed (the gateway is stopping)."""


class Origin(NamedTuple):
    host: str
    port: int
    tls: bool


def split(url: str) -> tuple[Origin, bytes]:
    """The origin of an http(s) `url`, and the start of a POST's head to it: request line,
    Host and nothing else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    if parts.username is not None:
        raise ValueError("credentials in a URL are never sent: give the deployment an api_key")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.netloc
    head = f"POST {target} HTTP/1.1\r\nhost: {host}\r\n".encode("ascii")
    return Origin(parts.hostname, port, tls), head


def header_lines(headers: dict[str, str]) -> bytes:
    """Header lines to send; a name or value that would end its line is refused, since it
    would let whoever chose it write headers of their own."""
    text = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        raise ValueError("a header name or value with a line break")
    return text.encode("latin-1")


@cache
def tls_context() -> ssl.SSLContext:
    """The system's trust store, certificates and host names verified."""
    return ssl.create_default_context()


class Connection(asyncio.Protocol):
    """One keep-alive connection, carrying one answer at a time.

    The parser's callbacks fill the answer's state; its consumer waits on one future at
    a time. Any failure (a timeout, a broken or unparsable answer, the upstream gone) is
    kept in `_error`, aborts the connection and wakes the consumer."""

    __slots__ = (
        "_body_ends_at_close",
        "_chunks",
        "_deadline",
        "_done",
        "_error",
        "_head_bytes",
        "_header_count",
        "_idle_s",
        "_last_read",
        "_loop",
        "_parser",
        "_paused",
        "_pool",
        "_read_ahead",
        "_timer",
        "_transport",
        "_waiter",
        "head_done",
        "headers",
        "idle_since",
        "pooled",
        "reusable",
        "status",
    )

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._transport: asyncio.Transport | None = None
        self._parser = HttpResponseParser(self)
        self._chunks: list[bytes] = []
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.pooled = False
        """Idle in its pool's keeping, rather than carrying an answer."""
        self.reusable = False
        """Its last answer was complete and kept the connection alive."""
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self._head_bytes = 0
        self._header_count = 0
        self._done = False
        self._body_ends_at_close = False
        self._error: BaseException | None = None
        self._read_ahead = 0
        self._paused = False
        self._deadline = 0.0
        self._idle_s: float | None = None
        self._last_read = 0.0

    # The consumer's side.

    def send(self, request: bytes, deadline: float, idle_s: float | None) -> None:
        """Write `request` and wait for its answer until `deadline` (loop time) at most,
        and, when `idle_s` is set, no longer than that for each read."""
        assert self._transport is not None
        self._reset()
        self.reusable = False
        self._deadline, self._idle_s = deadline, idle_s
        self._last_read = now = self._loop.time()
        due = deadline if idle_s is None else min(deadline, now + idle_s)
        self._timer = self._loop.call_at(due, self._on_time)
        if self._transport.is_closing():
            self._fail(Disconnected("the upstream closed the connection"))
        else:
            self._transport.write(request)

    async def head(self) -> None:
        """Return once the status and headers are in; raise what broke the answer first."""
        while not self.head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes:
        """All of the body that arrived since the last read (one part per read, however
        many the upstream framed it in); b"" once it is complete."""
        while True:
            chunks = self._chunks
            if chunks:
                taken = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._read_ahead = 0
                if self._paused:
                    self._paused = False
                    assert self._transport is not None
                    self._transport.resume_reading()
                return taken
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            self._last_read = self._loop.time()
            await self._wait()

    def finish(self) -> None:
        """The answer's holder is done with it: its timer ends; a connection whose answer
        did not complete cannot carry another and closes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._chunks.clear()
        if not (self._done and self.reusable):
            self.reusable = False
            self.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _wait(self) -> asyncio.Future[None]:
        self._waiter = waiter = self._loop.create_future()
        return waiter

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self.reusable = False
        self.close()
        self._wake()

    def _on_time(self) -> None:
        """The call's one timer: at its deadline, or when a stream's read waited too long;
        bytes held for a lagging consumer count as reads."""
        self._timer = None
        now = self._loop.time()
        due = self._deadline
        if self._idle_s is not None:
            if self._chunks:
                self._last_read = now
            due = min(due, self._last_read + self._idle_s)
        if now >= due:
            self._fail(TimeoutError())
        else:
            self._timer = self._loop.call_at(due, self._on_time)

    # The socket's side.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        if not self.head_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except HttpParserError as exc:
            self._fail(Unparsable(str(exc.__context__ or exc)))
            return
        if not self.head_done and self._head_bytes > MAX_HEAD_BYTES:
            self._fail(Unparsable(f"a head over {MAX_HEAD_BYTES} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self.pooled:
            self._pool.lost(self)
            return
        if not self._done:
            if exc is None and self._body_ends_at_close:
                self._done = True
                self._wake()
            else:
                self._fail(Disconnected("the upstream closed the connection"))

    def eof_received(self) -> bool:
        return False

    # httptools' callbacks.

    def on_message_begin(self) -> None:
        if self._done:
            # Bytes past the answer's end, or sent unasked to an idle connection.
            raise Unparsable("bytes after the answer's end")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > MAX_HEADERS:
            raise Unparsable(f"more than {MAX_HEADERS} headers")
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self.status < 200:
            # An interim answer (103 Early Hints): the answer itself follows.
            self.headers = {}
            return
        self.head_done = True
        headers = self.headers
        self._body_ends_at_close = "content-length" not in headers and not headers.get(
            "transfer-encoding", ""
        ).lower().endswith("chunked")
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._read_ahead += len(body)
        if self._read_ahead > READ_AHEAD_BYTES and not self._paused:
            self._paused = True
            assert self._transport is not None
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self.head_done:
            return
        self._done = True
        self.reusable = self._parser.should_keep_alive()
        self._wake()


class Pool:
    """At most `limit` connections to one origin, open or opening. Callers wait for a free
    one first come, first served; an idle one is reused newest first and closed once idle
    for `idle_s`, before a server that keeps connections about as long closes it under a
    request."""

    def __init__(self, origin: Origin, limit: int, idle_s: float, connect_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self._origin = origin
        self._tls = tls_context() if origin.tls else None
        self._limit = limit
        self._idle_s = idle_s
        self._connect_s = connect_s
        self._open = 0
        self._idle: deque[Connection] = deque()
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    async def acquire(self, deadline: float) -> Connection:
        """A connection, reused or new, within `connect_s` and `deadline` (loop time).
        Raises TimeoutError, or OSError when none can be opened."""
        if self._closed:
            raise PoolClosed("the pool is closed")
        idle, now = self._idle, self.loop.time()
        while idle:
            conn = idle.pop()
            conn.pooled = False
            if conn.reusable and now - conn.idle_since < self._idle_s:
                return conn
            self._discard(conn)
        if self._open < self._limit and not self._waiters:
            self._open += 1
            return await self._connect(deadline)
        waiter: asyncio.Future[Connection | None] = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(min(deadline, now + self._connect_s)):
                conn = await waiter
        except BaseException:
            if not waiter.done():
                waiter.cancel()
                self._waiters.remove(waiter)
            elif not waiter.cancelled() and waiter.exception() is None:
                handed = waiter.result()
                if handed is None:
                    self._free_slot()
                else:
                    self.release(handed)
            raise
        return conn if conn is not None else await self._connect(deadline)

    def release(self, conn: Connection) -> None:
        """Take back a connection whose answer is finished (`Connection.finish`)."""
        if not conn.reusable or self._closed:
            self._discard(conn)
            return
        conn.idle_since = self.loop.time()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.pooled = True
        self._idle.append(conn)
        if self._sweep is None:
            self._sweep = self.loop.call_at(conn.idle_since + self._idle_s, self._expire)

    def lost(self, conn: Connection) -> None:
        """An idle connection closed by its peer."""
        conn.pooled = False
        self._idle.remove(conn)
        self._free_slot()

    def close(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._idle:
            self._discard(self._idle.pop())
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolClosed("the pool is closed"))

    async def _connect(self, deadline: float) -> Connection:
        """A new connection in the slot the caller holds, freed again if none opens."""
        origin = self._origin
        try:
            async with asyncio.timeout_at(min(deadline, self.loop.time() + self._connect_s)):
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self), origin.host, origin.port, ssl=self._tls
                )
        except BaseException:
            self._free_slot()
            raise
        return conn

    def _discard(self, conn: Connection) -> None:
        conn.pooled = False
        conn.close()
        self._free_slot()

    def _free_slot(self) -> None:
        """A slot is free: the first waiter gets it (to connect), else the count drops."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._open -= 1

    def _expire(self) -> None:
        self._sweep = None
        idle, now = self._idle, self.loop.time()
        while idle and now - idle[0].idle_since >= self._idle_s:
            self._discard(idle.popleft())
        if idle:
            self._sweep = self.loop.call_at(idle[0].idle_since + self._idle_s, self._expire)
