"""The gateway's HTTP face: authentication, body limits and relaying; the pipeline does
the rest and records each request's outcome."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from sluicegate.answer import Answer
from sluicegate.api.asgi import (
    CLOSE,
    CONNECTION,
    JSON_HEADERS,
    SSE_HEADERS,
    ClientDisconnected,
    Connection,
    DisconnectWatcher,
    Headers,
    Receive,
    Router,
    Scope,
    Send,
    error_body,
    error_headers,
    read_body_within,
    send_bytes,
    send_error,
    send_json,
    shown,
)
from sluicegate.api.auth import Authenticator, key_digest, unauthorised
from sluicegate.api.payloads import parse
from sluicegate.core.clock import Clock
from sluicegate.core.errors import (
    SHUTTING_DOWN,
    ErrorType,
    GatewayError,
    bad_request,
    cut_by_shutdown,
    not_found,
    shutting_down,
)
from sluicegate.core.refusals import Refusal
from sluicegate.core.slo import Timeline
from sluicegate.core.types import Endpoint, Settings, Tenant
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.pipeline import Inbound, Pipeline
from sluicegate.providers.sse import frame

log = logging.getLogger("sluicegate")


_TIMING = {
    stage: b"%s;dur=%%.1f" % stage.encode()
    for stage in ("admission", "guardrail", "queue", "upstream", "answer_check")
}
"""The Server-Timing entry of each stage before the first byte."""


@dataclass(slots=True)
class Exchange:
    """What the edge learns about one request while answering it."""

    send: Send
    timeline: Timeline
    connection: Connection | None = None
    started: bool = False

    def timed(self, headers: Headers, now: float) -> Headers:
        """`headers` and where the time before the first byte went, in milliseconds (W3C
        Server-Timing): `admission` (the gates and the body), `guardrail` (pre-call
        checks, when the request has any), `queue` (waiting for a
        turn, and earlier attempts of a retried request), `upstream` (the deployment's
        own queue and prefill; a non-streamed answer's first bytes come with its whole
        body), `answer_check` (a non-streamed answer's post-call and parallel checks,
        when it has any), as far as the request got, so a caller can tell whose wait it
        was."""
        timing = b", ".join(
            _TIMING[stage] % (1000 * took_s)
            for stage, took_s in self.timeline.stages(now)
            if stage in _TIMING
        )
        return [*headers, (b"server-timing", timing)]

    async def start(
        self, status: int, headers: list[tuple[bytes, bytes]], body_follows: bool = False
    ) -> None:
        """`body_follows`: the first body bytes are in hand and sent next, so the head
        may wait for them (`Connection.hold_head`)."""
        self.started = True
        if body_follows and self.connection is not None:
            self.connection.hold_head()
        await self.send({"type": "http.response.start", "status": status, "headers": headers})


class Gateway:
    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        metrics: GatewayMetrics,
        clock: Clock,
        status: Callable[[], Awaitable[dict[str, Any]]],
    ) -> None:
        self._settings = settings
        self._edge = settings.edge
        self._status = status
        self._authenticate = Authenticator(settings.keys)
        self._admin_keys = settings.admin_keys
        self._pipeline = pipeline
        self._metrics = metrics
        self._clock = clock
        self._model_lists: dict[str, bytes] = {}
        self.ready = False
        self._open: set[asyncio.Task[Any]] = set()
        """The tasks of the inference requests being answered, for a stop to cut."""

    def routes(self, router: Router, *, metrics: bool = True) -> Router:
        """`metrics` False: `/metrics` has an address of its own (`metrics_routes`)."""
        for endpoint in Endpoint:
            router.add("POST", endpoint.path, self._inference_handler(endpoint))
        router.add("GET", "/v1/models", self._models)
        router.add_prefix("GET", MODEL, self._model)
        router.add("GET", "/health", self._health)
        router.add("GET", "/ready", self._ready)
        if metrics:
            router.add("GET", "/metrics", self._metrics_page)
        router.add("GET", "/admin/status", self._admin_status)
        return router

    def metrics_routes(self, router: Router) -> Router:
        """The routes of the metrics address, when it has one of its own."""
        router.add("GET", "/metrics", self._metrics_page)
        router.add("GET", "/health", self._health)
        return router

    def _inference_handler(self, endpoint: Endpoint):  # noqa: ANN202 - an ASGI handler
        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            await self._inference(endpoint, scope, receive, send)

        return handle

    async def _inference(
        self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send
    ) -> None:
        connection: Connection | None = scope.get("extensions", _NO_EXTENSIONS).get(CONNECTION)
        exchange = Exchange(send, Timeline(self._clock.now()), connection)
        in_flight = self._metrics.in_flight(endpoint.value)
        in_flight.inc()
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        try:
            try:
                inbound = self._inbound(endpoint, scope, receive, connection, exchange.timeline)
            except GatewayError as err:
                # Refused before the pipeline, which records everything after this.
                self._pipeline.refused_at_edge(endpoint, err, exchange.timeline)
                raise
            if connection is not None:
                connection.bound_sends(self._time_left_s(endpoint, inbound))
            await self._serve(inbound, exchange)
        except GatewayError as err:
            await self._fail(exchange, err)
        except ClientDisconnected:
            pass
        except asyncio.CancelledError as err:
            if not cut_by_shutdown(err):
                raise
            task.uncancel()
            await self._cut(exchange)
        except Exception:
            log.exception("unexpected failure on %s", endpoint.path)
            await self._fail(exchange, _internal())
        finally:
            self._open.discard(task)
            if connection is not None:
                connection.bound_sends(None)
            in_flight.dec()

    def begin(self) -> None:
        """The server is stopping: load balancers are told at once, by `/ready`."""
        self.ready = False

    def cut(self) -> None:
        """The stop's grace period is over: every inference request still open ends now,
        with an answer that says so (`_cut`)."""
        for task in self._open:
            task.cancel(SHUTTING_DOWN)

    async def _cut(self, exchange: Exchange) -> None:
        """One line per request cut, named by its id (no traceback: nothing failed), and
        an explicit error to its caller: an error event ends a started stream, so the
        caller never takes a cut stream for a whole one."""
        took_s = self._clock.now() - exchange.timeline.arrived_s
        what = "stream" if exchange.started else "request"
        log.warning(
            "cut an open %s at the end of the stop's grace period, %.1fs after it arrived",
            what,
            took_s,
            extra={"always": True},
        )
        await self._fail(exchange, shutting_down())

    def _time_left_s(self, endpoint: Endpoint, inbound: Inbound) -> float:
        timeout_s = inbound.timeout_s or self._settings.routes[endpoint].default_timeout_s
        return inbound.arrived_s + timeout_s - self._clock.now()

    def _inbound(
        self,
        endpoint: Endpoint,
        scope: Scope,
        receive: Receive,
        connection: Connection | None,
        timeline: Timeline,
    ) -> Inbound:
        """What the headers say; the body is read by the pipeline, after the tenant's gate,
        within `server.body_timeout_s` (kept by the server's connection)."""
        limit, timeout_s = self._settings.max_body_bytes, self._edge.body_timeout_s
        route = self._settings.routes[endpoint]
        headers = dict(reversed(scope["headers"]))  # the first of each name, as `header` reads
        _identity_encoding(headers)

        async def payload() -> dict[str, Any]:
            body = await read_body_within(scope, receive, limit, timeout_s)
            return parse(endpoint, body, route.max_messages)

        return Inbound(
            endpoint,
            self._authenticate(scope),
            timeline.arrived_s,
            payload,
            _timeout_s(headers, route.max_timeout_s),
            _lane(headers),
            _client_retries(headers),
            watch=lambda: DisconnectWatcher(receive, connection),
            body_in=_whole_not_known if connection is None else connection.body_complete,
            timeline=timeline,
        )

    async def _serve(self, inbound: Inbound, exchange: Exchange) -> None:
        """The request's whole life; every permit taken is released when `run` ends.
        The response's final message goes out after that, outside the disconnect
        watcher."""
        async with self._pipeline.run(inbound) as answer:
            if answer.call.stream:
                await self._relay_stream(exchange, answer)
            else:
                body = await answer.read()
        if exchange.started:
            await exchange.send({"type": "http.response.body", "body": b""})
        else:
            headers = exchange.timed(JSON_HEADERS, self._clock.now())
            await exchange.start(200, headers, body_follows=True)
            await exchange.send({"type": "http.response.body", "body": body})

    async def _relay_stream(self, exchange: Exchange, answer: Answer) -> None:
        """Pass upstream bytes through as they arrive: no buffering, no re-serialisation."""
        send = exchange.send
        headers = exchange.timed(SSE_HEADERS, self._clock.now())
        await exchange.start(200, headers, body_follows=answer.checks is None)
        async for chunk in answer.chunks():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def _fail(self, exchange: Exchange, err: GatewayError) -> None:
        """Answer an error; once a stream has started, end it with an explicit error event."""
        if exchange.started:
            event = frame(error_body(err))
            await exchange.send({"type": "http.response.body", "body": event})
        else:
            unread = err.status in _UNREAD_BODY or err.code == Refusal.BODY_BUDGET
            headers = exchange.timed(
                error_headers(err) + (CLOSE if unread else []), self._clock.now()
            )
            await send_bytes(exchange.send, err.status, error_body(err), headers)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            tenant = self._authenticate(scope)
        except GatewayError as err:
            await send_error(send, err)
            return
        listing = self._model_lists.get(tenant.name)
        if listing is None:
            listing = self._model_lists[tenant.name] = _model_list(self._settings, tenant)
        await send_bytes(send, 200, listing, JSON_HEADERS)

    async def _model(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One model as the tenant's list shows it: one it may not use is not found, as
        it is not listed."""
        try:
            tenant = self._authenticate(scope)
            name = scope["path"][len(MODEL) :]
            if name not in self._settings.models or not tenant.may_use(name):
                raise not_found(f"the model {shown(name)} does not exist", "model_not_found")
        except GatewayError as err:
            await send_error(send, err)
            return
        await send_bytes(send, 200, orjson.dumps(_model_entry(name)), JSON_HEADERS)

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"status": "ok"})

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 200 if self.ready else 503
        await send_json(send, status, {"status": "ready" if self.ready else "not ready"})

    async def _admin_status(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Overload state, queues and gates; for holders of an admin key only."""
        if key_digest(scope) not in self._admin_keys:
            await send_error(send, unauthorised("an admin key is required"))
            return
        await send_json(send, 200, await self._status())

    async def _metrics_page(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = self._settings.metrics.keys
        if keys and key_digest(scope) not in keys:
            await send_error(send, unauthorised("a metrics token is required"))
            return
        body = await self._metrics.page()
        await send_bytes(send, 200, body, [(b"content-type", b"text/plain; version=0.0.4")])


def _model_list(settings: Settings, tenant: Tenant) -> bytes:
    data = [_model_entry(name) for name in settings.models if tenant.may_use(name)]
    return orjson.dumps({"object": "list", "data": data})


def _model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "sluicegate"}


def _timeout_s(headers: Mapping[bytes, bytes], longest_s: float) -> float | None:
    """The caller's deadline: ours explicitly, else the `openai` SDK's own read timeout;
    at most the route's `longest_s`, so no caller holds a place for ever."""
    for name in (b"x-sluicegate-timeout", b"x-stainless-read-timeout"):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            raise bad_request(f"{name.decode()} must be a number of seconds") from None
        if not seconds > 0 or seconds == float("inf"):
            raise bad_request(f"{name.decode()} must be a positive number of seconds")
        return min(seconds, longest_s)
    return None


def _lane(headers: Mapping[bytes, bytes]) -> str | None:
    value = headers.get(b"x-sluicegate-lane")
    return None if value is None else value.decode("latin-1")


def _client_retries(headers: Mapping[bytes, bytes]) -> int:
    """The `openai` SDKs number their retries; a malformed count is no hint, not an error."""
    value = headers.get(b"x-stainless-retry-count")
    if value is None or not value.isdigit():
        return 0
    return int(value[:6])


_NO_EXTENSIONS: dict[str, Any] = {}
MODEL = "/v1/models/"
"""A model's own path: its name follows."""

_UNREAD_BODY = frozenset({408, 413, 415})
"""Refusals that leave the request body unread: the connection closes after them, since
what follows on it is not the start of a request."""


def _identity_encoding(headers: Mapping[bytes, bytes]) -> None:
    """Compressed bodies are refused: inflating one would let a few bytes on the wire
    pass `max_body_bytes` many times over."""
    encoding = headers.get(b"content-encoding")
    if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
        raise GatewayError(
            415,
            "unsupported_encoding",
            "compressed request bodies are not accepted: send the body without Content-Encoding",
            ErrorType.INVALID_REQUEST,
            should_retry=False,
        )


def _whole_not_known() -> bool:
    """Without the server's connection, whether the body is whole is not known."""
    return False


def _internal() -> GatewayError:
    return GatewayError(
        500, "internal_error", "the gateway failed unexpectedly", ErrorType.INTERNAL
    )
