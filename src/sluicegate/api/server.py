"""Run an ASGI app on uvicorn with the fast loop and parser, the same way for every command.

uvicorn bounds neither the receipt of a request's headers nor their number or size, and
its `limit_concurrency` answers 503 only once a request's headers have arrived, so an
idle or trickling connection holds a file descriptor for ever. `GuardedHttp` adds what is
missing at the protocol, where the bytes arrive (an ASGI app sees a request only once its
headers are in): a connection limit, a deadline for the headers, and bounds on their
count and size. It also bounds how long the connection may wait for a client that stopped
reading: uvicorn's `send` waits for its write buffer to drain with no bound, and closing
such a connection would wait for ever too, so it is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
import signal
import socket
from collections.abc import Callable, Sequence
from types import FrameType
from typing import NoReturn, Protocol

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from sluicegate.api.asgi import CONNECTION, Handler
from sluicegate.core.errors import ErrorType
from sluicegate.core.ids import new_request_id
from sluicegate.core.types import EdgeLimits

BACKLOG = 2048
DEFAULT_LIMITS = EdgeLimits()
NEVER = math.inf

log = logging.getLogger("sluicegate.server")


def listen(
    host: str, port: int, *, reuse_port: bool = False, listening: bool = True
) -> socket.socket:
    """Bind before announcing anything, so a taken port fails with one clear line.

    Handing uvicorn a ready socket also keeps it from starting resolver threads,
    which can receive (and lose) the SIGINT meant for the server. With `reuse_port`,
    each of several worker processes binds its own socket on the same port and the
    kernel spreads new connections over them (one shared accept queue hands most of
    them to whichever worker is warm). Bound but not `listening`, a socket holds the
    port for the group without taking connections.
    """
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind((host, port))
        if listening:
            listener.listen(BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener


SPARE_FILES = 128
"""Files a gateway holds beyond its client and upstream connections: its listening
socket and event loop, logs, Redis and job store connections, backend metric scrapes."""


def fit_open_files(wanted: int) -> str | None:
    """Raise the soft open-files limit towards the hard one until `wanted` fit, or say
    why they cannot: past the limit `accept` fails with EMFILE, and clients are refused
    long before `server.max_connections`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return None
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target >= wanted:
        return None
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return (
        f"the open-files limit is {target} (hard limit {shown}), fewer than the {wanted} "
        "that server.max_connections and the deployments' max_connections may need; "
        "raise it (ulimit -n, systemd LimitNOFILE=) or lower server.max_connections"
    )


class Stopping(Protocol):
    """What an app does while the server stops (`serve`)."""

    def begin(self) -> None:
        """The stop signal arrived: from now on report not ready."""

    def cut(self) -> None:
        """The grace period is over: end every request still open, each with an answer
        that says why."""


CUT_S = 2.0
"""How long requests cut at the end of the grace period get to send their last words
before uvicorn cancels what is left."""


def serve(
    app: Handler,
    listeners: Sequence[socket.socket],
    *,
    log_level: str = "warning",
    graceful_s: float = 5.0,
    limits: EdgeLimits = DEFAULT_LIMITS,
    stopping: Stopping | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM; open requests get `graceful_s` to finish, those
    still open are then cut (`stopping`), the app's shutdown runs, and this returns.

    uvicorn re-raises the signal it caught once it has shut down. For SIGTERM (the stop
    signal of systemd, Docker and Kubernetes) the default action would end the process
    on the spot, skipping the caller's own clean-up (such as stopping the demo's
    simulator), so it is turned into the same quiet return as SIGINT.
    """
    config = server_config(app, limits, log_level, graceful_s + (CUT_S if stopping else 0))
    server = StoppingServer(config, stopping, graceful_s)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=list(listeners))
    finally:
        signal.signal(signal.SIGTERM, previous)


class StoppingServer(uvicorn.Server):
    """uvicorn's server, telling the app when the stop begins (at the signal, before
    uvicorn's next tick closes the listener) and when its grace period ends."""

    def __init__(self, config: uvicorn.Config, stopping: Stopping | None, grace_s: float) -> None:
        super().__init__(config)
        self._stopping = stopping
        self._grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._stopping is not None and not self.should_exit:
            self._stopping.begin()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        stopping = self._stopping
        if stopping is None:
            await super().shutdown(sockets)
            return
        cut = asyncio.get_running_loop().call_later(self._grace_s, stopping.cut)
        try:
            await super().shutdown(sockets)
        finally:
            cut.cancel()


def server_config(
    app: Handler, limits: EdgeLimits, log_level: str = "warning", graceful_s: float = 5.0
) -> uvicorn.Config:
    """uvicorn leaves logging alone (`observability.logs` configures it): its records
    reach the process's handler like every other. Nothing reads a request's client
    address or scheme, so uvicorn's rewriting of them from `X-Forwarded-*` headers,
    a wrapper around every request, is off."""
    return uvicorn.Config(
        app,
        loop="uvloop",
        http=guarded(limits),
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        log_config=None,
        log_level=log_level,
        backlog=BACKLOG,
        timeout_graceful_shutdown=math.ceil(graceful_s),
        timeout_keep_alive=limits.keep_alive_s,
    )


def guarded(limits: EdgeLimits) -> type[GuardedHttp]:
    """The protocol class uvicorn instantiates per connection, bound to `limits`."""
    return type("GuardedHttp", (GuardedHttp,), {"limits": limits})


class _Refused(Exception):
    """Raised inside a parser callback so httptools stops; the status says why."""


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's protocol with the bounds above, and the `Connection` of asgi.CONNECTION.

    Headers late by `header_timeout_s` get a 408. A body still incomplete when the time
    its request gave it in `read_within` is up wakes the request's reader, which answers
    408. A transport that refuses more bytes (uvicorn's `pause_writing`) for
    `write_timeout_s`, or past the deadline its request set with `bound_sends`, is
    aborted: the request sees an ordinary disconnect and ends as the caller's failure
    (499), which no breaker learns from. Deadlines are kept as times and watched by one
    timer per connection, armed for the earliest and re-armed when it fires, so a request
    that meets them all creates no timer of its own.

    The parent's methods that run for every request are called by name: `super()`
    costs a lookup on each call.
    """

    limits = DEFAULT_LIMITS

    _refusal: bytes | None = None
    _header_bytes = 0
    _header_raw = 0
    _timer: asyncio.TimerHandle | None = None
    _timer_at = NEVER
    _headers_due = NEVER
    _body_due = NEVER
    _body_late = False
    _stalled_at = NEVER
    _sends_due = NEVER
    _on_lost: Callable[[], None] | None = None
    _extensions: dict[str, object]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._extensions = {CONNECTION: self}
        if len(self.connections) > self.limits.max_connections:
            log.warning("refused a connection: %d are open", len(self.connections) - 1)
            self._refuse(b"503 Service Unavailable", "too many open connections")
            return
        self._headers_due = due = self.loop.time() + self.limits.header_timeout_s
        self._arm_at(due)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()

    def on_message_begin(self) -> None:
        HttpToolsProtocol.on_message_begin(self)
        self._header_bytes = 0
        self._header_raw = -1
        self._body_due = NEVER
        if self._headers_due == NEVER:  # due from the request's first byte
            self._headers_due = due = self.loop.time() + self.limits.header_timeout_s
            if due < self._timer_at:
                self._arm_at(due)
        self.scope["extensions"] = self._extensions

    def data_received(self, data: bytes) -> None:
        """Bounds a header section still open after this read: httptools hands a header
        over only once it is whole, so one endless header would otherwise grow until the
        header deadline. It may take `max_header_bytes` and the separators of
        `max_headers` headers (the exact bounds apply header by header); the read that
        began the request is not counted, since it may hold the end of the one before.
        """
        HttpToolsProtocol.data_received(self, data)
        if self._headers_due == NEVER:
            return
        if self._header_raw < 0:
            self._header_raw = 0
            return
        self._header_raw += len(data)
        limits = self.limits
        if self._header_raw > limits.max_header_bytes + 4 * limits.max_headers + 64:
            self._refuse(_TOO_LARGE, _TOO_LARGE_REASON)

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's own (the name lowercased, `Expect: 100-continue` noted), counted as it
        goes: this runs for every header of every request, so it is one call, not two.
        The URL's bytes join the count once the headers are complete."""
        self._header_bytes += len(name) + len(value)
        headers, limits = self.headers, self.limits
        if len(headers) >= limits.max_headers or self._header_bytes > limits.max_header_bytes:
            self._too_large()
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_due = NEVER
        if self._header_bytes + len(self.url) > self.limits.max_header_bytes:
            self._too_large()
        HttpToolsProtocol.on_headers_complete(self)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error, which is how a refused header arrives."""
        if self._refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse(self._refusal, _TOO_LARGE_REASON)

    def _too_large(self) -> NoReturn:
        self._refusal = _TOO_LARGE
        raise _Refused

    def pause_writing(self) -> None:
        super().pause_writing()
        self._stalled_at = self.loop.time()
        self._wake_by(self._stall_due())

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stalled_at = NEVER

    def read_within(self, timeout_s: float) -> None:
        self._body_late = False
        self._body_due = due = self.loop.time() + timeout_s
        if due < self._timer_at:
            self._arm_at(due)

    def body_late(self) -> bool:
        return self._body_late

    def body_complete(self) -> bool:
        """The newest request's flag: a request whose own cycle is older has its whole body
        in (the next one's headers followed it), and is told "not known", never wrongly
        "complete"."""
        return not self.cycle.more_body

    def abort(self) -> None:
        self.transport.abort()

    def hold_head(self) -> None:
        """One segment instead of two for the head and the first body bytes: the client
        wakes once, and the gateway makes one write. A HEAD answer writes no body, so
        its head is never held."""
        cycle = self.cycle
        if cycle.scope["method"] != "HEAD" and not cycle.response_started:
            cycle.transport = HeldHead(cycle, self.transport)  # type: ignore[assignment]

    def watch(self, on_lost: Callable[[], None] | None) -> None:
        """Reading goes on while a request is watched, as a `receive()` waiting for the
        disconnect would have it: a paused transport would not see the client leave."""
        if on_lost is not None and (self.transport.is_closing() or self.cycle.disconnected):
            on_lost()
            return
        self._on_lost = on_lost
        if on_lost is not None:
            self.flow.resume_reading()

    def bound_sends(self, left_s: float | None) -> None:
        self._sends_due = NEVER if left_s is None else self.loop.time() + left_s
        if self._stalled_at != NEVER:
            self._wake_by(self._stall_due())

    def _stall_due(self) -> float:
        if self._stalled_at == NEVER:
            return NEVER
        return min(self._stalled_at + self.limits.write_timeout_s, self._sends_due)

    def _wake_by(self, at: float) -> None:
        """Have the timer fire no later than `at`; one that fires earlier re-arms itself."""
        if at < self._timer_at:
            self._arm_at(at)

    def _arm_at(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(at, self._check)
        self._timer_at = at

    def _check(self) -> None:
        self._timer, self._timer_at = None, NEVER
        now = self.loop.time()
        if now >= self._stall_due():
            self.transport.abort()
            return
        if now >= self._headers_due:
            self._headers_due = NEVER
            self._refuse(b"408 Request Timeout", "the request headers did not arrive in time")
        if now >= self._body_due:
            self._body_due = NEVER
            if self.cycle.more_body:
                self._body_late = True
                self.cycle.message_event.set()
        self._wake_by(min(self._headers_due, self._body_due, self._stall_due()))

    def _refuse(self, status: bytes, reason: str) -> None:
        """Answer in OpenAI's error shape and close: no app has seen this request, so
        its id is made here."""
        code, kind = _CODES[status[:3]]
        rid = new_request_id()
        error = {"message": reason, "type": kind, "param": None, "code": code, "request_id": rid}
        body = orjson.dumps({"error": error})
        head = (
            b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"x-request-id: " + rid.encode() + b"\r\n"
        )
        length = b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
        if not self.transport.is_closing():
            self.transport.write(head + length + body)
            self.transport.close()


class HeldHead:
    """The transport as one response's cycle sees it while the response's head waits:
    uvicorn writes the head first, then each body message, so the first write is held
    and goes out with the second, after which the cycle writes to the transport
    itself again. Closing sends what is held first."""

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, cycle: RequestResponseCycle, transport: asyncio.Transport) -> None:
        self._cycle = cycle
        self._transport = transport
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is None:
            self._head = data
            return
        self._release()
        self._transport.write(head + data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        head = self._head
        self._release()
        if head is not None:
            self._transport.write(head)
        self._transport.close()

    def _release(self) -> None:
        self._head = None
        self._cycle.transport = self._transport


_TOO_LARGE = b"431 Request Header Fields Too Large"
_TOO_LARGE_REASON = "the request headers are too large"
_CODES = {
    b"408": ("header_timeout", ErrorType.INVALID_REQUEST),
    b"431": ("headers_too_large", ErrorType.INVALID_REQUEST),
    b"503": ("too_many_connections", ErrorType.UNAVAILABLE),
}


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
