"""Minimal pure-ASGI plumbing shared by the gateway and the simulator.

A framework would add a request object, a middleware stack and a task group per
streamed response; the gateway's hot path needs none of them, so the edge is a
route table and a handful of send helpers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Protocol

import orjson

from sluicegate.core.errors import CallerGone, ErrorType, GatewayError
from sluicegate.core.ids import request_id
from sluicegate.core.refusals import Refusal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
Hook = Callable[[], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON_HEADERS: Headers = [(b"content-type", b"application/json")]
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


CONNECTION = "sluicegate.connection"
"""The scope extension by which the server (`server.GuardedHttp`) lets a request bound
what its connection may cost: a `Connection`. Without it (another ASGI server) the body's
arrival and the sends are unbounded in time."""

CLOSE: Headers = [(b"connection", b"close")]


class Connection(Protocol):
    def read_within(self, timeout_s: float) -> None:
        """The request's body must be in within `timeout_s`: past it, `body_late` turns
        true and a `receive()` waiting for more returns."""

    def body_late(self) -> bool: ...

    def body_complete(self) -> bool:
        """Whether the request's whole body has arrived, so reading it waits for nothing
        (False may also mean "not known": a later pipelined request's body is arriving)."""

    def bound_sends(self, left_s: float | None) -> None:
        """No send may wait for the client to read past `left_s` from now (None: only the
        server's write timeout applies), else the connection is aborted."""

    def abort(self) -> None:
        """Drop the connection now: an answer cut short after its start must not look
        complete, and closing would wait for unsent bytes to drain."""

    def watch(self, on_lost: Callable[[], None] | None) -> None:
        """Call `on_lost` once when the client goes away (at once if it has gone);
        None stops watching."""

    def hold_head(self) -> None:
        """The response about to start has its first body bytes in hand: its head waits
        for them, so that both leave in one write."""


class ClientDisconnected(CallerGone):
    """The HTTP client disconnected."""


def error_body(err: GatewayError) -> bytes:
    """OpenAI's error shape, with the id of the request it answers (`core.ids`), which
    a caller can quote to an operator."""
    error = {"message": err.message, "type": err.error_type, "param": err.param, "code": err.code}
    rid = request_id()
    if rid is not None:
        error["request_id"] = rid
    return orjson.dumps({"error": error})


def error_headers(err: GatewayError) -> Headers:
    headers = list(JSON_HEADERS)
    if err.retry_after_s is not None:
        whole = max(0, int(-(-err.retry_after_s // 1)))
        headers.append((b"retry-after", str(whole).encode()))
        headers.append((b"retry-after-ms", str(max(0, round(err.retry_after_s * 1000))).encode()))
    if err.should_retry is not None:
        headers.append((b"x-should-retry", b"true" if err.should_retry else b"false"))
    return headers


async def send_bytes(send: Send, status: int, body: bytes, headers: Headers) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: object) -> None:
    await send_bytes(send, status, orjson.dumps(payload), JSON_HEADERS)


async def send_error(send: Send, err: GatewayError, *, close: bool = False) -> None:
    """`close`: the request's body was not read to its end, so what follows on the
    connection is not the start of a request (and a trickled body must not keep it)."""
    headers = error_headers(err) + CLOSE if close else error_headers(err)
    await send_bytes(send, err.status, error_body(err), headers)


async def read_body(
    receive: Receive,
    limit: int,
    into: Callable[[bytes], None] | None = None,
    late: Callable[[], bool] | None = None,
) -> bytes:
    """Read the whole request body, refusing it once it passes `limit` bytes, and with
    TimeoutError once `late` says the rest is overdue. With `into` (a streaming parser),
    each part goes there as it arrives, none is kept, and the answer is empty."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refusal.BODY_TOO_LARGE.error(f"request body exceeds the limit of {limit} bytes")
        if into is None:
            chunks.append(chunk)
        else:
            into(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if late is not None and late():
            raise TimeoutError


async def read_body_within(
    scope: Scope,
    receive: Receive,
    limit: int,
    timeout_s: float,
    into: Callable[[bytes], None] | None = None,
) -> bytes:
    """`read_body`, with the whole body due within `timeout_s` (a 408 past it), kept by
    the server's connection; without one (another ASGI server) it is not bounded in time."""
    connection: Connection | None = scope.get("extensions", _NONE).get(CONNECTION)
    late = None
    if connection is not None:
        connection.read_within(timeout_s)
        late = connection.body_late
    try:
        return await read_body(receive, limit, into, late)
    except TimeoutError:
        raise body_late(timeout_s) from None


def body_unread(scope: Scope) -> bool:
    """Whether the request's body may still be arriving (unknown without the server's
    connection, where an answer leaves the connection as the server decides)."""
    connection: Connection | None = scope.get("extensions", _NONE).get(CONNECTION)
    return connection is not None and not connection.body_complete()


def body_late(timeout_s: float) -> GatewayError:
    return GatewayError(
        408,
        "body_timeout",
        f"the request body did not arrive within {timeout_s:g}s",
        ErrorType.INVALID_REQUEST,
        should_retry=False,
    )


_NONE: dict[str, Any] = {}


def shown(path: str) -> str:
    """A request path fit for a log line or a message: quoted and escaped (a decoded
    `%0a` is a newline) and cut short, since the path is whatever the client sent."""
    text = repr(path)
    return text if len(text) <= 200 else f"{text[:200]}..."


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


class DisconnectWatcher:
    """Cancels the owning task the moment the client disconnects.

    ASGI servers report a disconnect only through `receive()`, which nobody calls
    once the body is read; without a watcher an abandoned request keeps its
    upstream call (and the provider's work) running until it finishes. Servers also
    answer `receive()` with a disconnect once the response is complete, so the
    response's final message must be sent after the watched block.

    Given the server's `Connection`, the watcher registers with it and costs no task:
    the connection calls back when it is lost. Without one (another ASGI server), a
    task waits on `receive()`.
    """

    __slots__ = ("_connection", "_fired", "_owner", "_receive", "_task")

    def __init__(self, receive: Receive, connection: Connection | None = None) -> None:
        self._receive = receive
        self._connection = connection
        self._fired = False
        self._owner: asyncio.Task[Any] | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DisconnectWatcher:
        self._owner = asyncio.current_task()
        if self._connection is not None:
            self._connection.watch(self._lost)
            return self
        self._task = asyncio.get_running_loop().create_task(self._watch())
        self._task.add_done_callback(_retrieve)
        return self

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._lost()

    def _lost(self) -> None:
        self._fired = True
        if self._owner is not None:
            self._owner.cancel()

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> bool:
        # Dropping the references breaks the cycle task -> its CancelledError -> the
        # watch frame -> self -> task, which would leave each request's garbage to the
        # slow full collections.
        task, owner, self._task, self._owner = self._task, self._owner, None, None
        if self._connection is not None:
            self._connection.watch(None)
        if task is not None:
            task.cancel()
        if not self._fired or owner is None:
            return False
        owner.uncancel()
        if exc_type is asyncio.CancelledError:
            raise ClientDisconnected
        return False


def _retrieve(task: asyncio.Task[None]) -> None:
    """Collect a watcher's failure so it is never reported as 'never retrieved'."""
    if not task.cancelled():
        task.exception()


class Router:
    """Exact paths, then the longest matching prefix, with 404/405 answers in OpenAI's
    error shape. Prefixes serve paths that carry an id (`/v1/jobs/{id}`); exact paths are
    looked up first, so the inference routes never pay for them."""

    def __init__(self, on_startup: Iterable[Hook] = (), on_shutdown: Iterable[Hook] = ()) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}
        self._prefixes: list[tuple[str, dict[str, Handler]]] = []
        self._on_startup = list(on_startup)
        self._on_shutdown = list(on_shutdown)

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._routes.setdefault(path, {})[method] = handler

    def add_prefix(self, method: str, prefix: str, handler: Handler) -> None:
        """Route `method` on every path under `prefix`; the handler reads the rest of the path."""
        for known, methods in self._prefixes:
            if known == prefix:
                methods[method] = handler
                return
        self._prefixes.append((prefix, {method: handler}))
        self._prefixes.sort(key=lambda entry: len(entry[0]), reverse=True)

    def _methods(self, path: str) -> dict[str, Handler] | None:
        methods = self._routes.get(path)
        if methods is None:
            methods = next((m for prefix, m in self._prefixes if path.startswith(prefix)), None)
        return methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            methods = self._methods(scope["path"])
            handler = methods.get(scope["method"]) if methods else None
            if handler is not None:
                await handler(scope, receive, send)
            elif methods:
                await send_error(send, _no_method(scope))
            else:
                await send_error(send, _no_route(scope))
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            phase = message["type"].rsplit(".", 1)[-1]
            hooks = self._on_startup if phase == "startup" else self._on_shutdown
            try:
                for hook in hooks:
                    await hook()
            except Exception as exc:  # reported to the server, which stops cleanly
                await send({"type": f"lifespan.{phase}.failed", "message": str(exc)})
                return
            await send({"type": f"lifespan.{phase}.complete"})
            if phase == "shutdown":
                return


def _no_route(scope: Scope) -> GatewayError:
    return GatewayError(
        404,
        "unknown_route",
        f"no route {shown(scope['path'])}",
        ErrorType.NOT_FOUND,
        should_retry=False,
    )


def _no_method(scope: Scope) -> GatewayError:
    return GatewayError(
        405,
        "method_not_allowed",
        f"{scope['method']} is not allowed on {shown(scope['path'])}",
        ErrorType.INVALID_REQUEST,
        should_retry=False,
    )
