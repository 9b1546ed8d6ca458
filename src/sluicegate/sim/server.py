"""The simulator's HTTP face: vLLM's OpenAI-compatible routes plus /sim control routes.

Every inference request runs under a DisconnectWatcher, so a client that goes away
frees its sequence's slot and KV blocks at once, as vLLM aborts a disconnected request.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from prometheus_client import CONTENT_TYPE_LATEST

from sluicegate.api.asgi import (
    JSON_HEADERS,
    SSE_HEADERS,
    ClientDisconnected,
    DisconnectWatcher,
    Handler,
    Message,
    Receive,
    Router,
    Scope,
    Send,
    error_body,
    header,
    read_body,
    send_bytes,
    send_error,
    send_json,
)
from sluicegate.core.errors import ErrorType, GatewayError, bad_request, not_found
from sluicegate.sim import guard
from sluicegate.sim.anthropic import MessageEvents, MessagesFace
from sluicegate.sim.engine import Engine, Rejected, Sequence
from sluicegate.sim.faults import FaultInjector
from sluicegate.sim.lies import Cut, metrics_text, redirect, tell, throttle_headers
from sluicegate.sim.metrics import SimMetrics
from sluicegate.sim.options import SimOptions
from sluicegate.sim.protocol import (
    GenerationRequest,
    chat_contents,
    load_object,
    parse_chat,
    parse_completion,
    parse_embedding,
)
from sluicegate.sim.render import (
    Kind,
    StreamEvents,
    completion_body,
    embedding_body,
    text,
    usage,
)

MAX_BODY_BYTES = 32 * 1024 * 1024
_METRICS_HEADERS = [(b"content-type", CONTENT_TYPE_LATEST.encode())]

Payload = dict[str, Any]
PayloadHandler = Callable[[Payload, Receive, Send], Awaitable[None]]


class ConnectionDropped(Exception):
    """Raised after the response started so that the server cuts the connection."""


class _QuietDrops(logging.Filter):
    """Keeps the expected, injected connection drops out of uvicorn's error log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[0] is ConnectionDropped)


_QUIET_DROPS = _QuietDrops()


def _part(body: bytes) -> Message:
    """A body message that leaves the response open for more."""
    return {"type": "http.response.body", "body": body, "more_body": True}


class SimServer:
    """Owns the engine, faults and metrics of one simulator; `app` is its ASGI callable."""

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.engine = Engine(options.engine, slowdown=lambda: options.faults.slowdown)
        self._caching = options.engine.prefix_caching
        self.metrics = SimMetrics(self.engine, options.models[0], options.metrics_generation)
        self.engine.observer = self.metrics
        self.injector = FaultInjector(options.faults, options.seed)
        self.received = 0
        self.failed = 0
        self._ids = itertools.count(1)
        self.heard: deque[dict[str, str | None]] = deque(maxlen=HEARD)
        """The request ids and trace contexts of the latest requests, as a backend's own
        logs would show them."""
        self.bodies: deque[Payload] = deque(maxlen=HEARD)
        """The latest inference requests' bodies, as parsed: what a gateway really sent
        (a test of masking asserts on it)."""
        self._auth = None if options.api_key is None else f"Bearer {options.api_key}".encode()
        self.app = Router(on_startup=[self._startup], on_shutdown=[self.engine.stop])
        routes: list[tuple[str, str, Handler]] = [
            ("POST", "/v1/chat/completions", self._inference(self._chat)),
            ("POST", "/v1/completions", self._inference(self._completion)),
            ("POST", "/v1/embeddings", self._inference(self._embedding)),
            ("POST", "/v1/messages", MessagesFace(self, self._stream, self._respond).route),
            ("GET", "/v1/models", self._models),
            ("GET", "/health", self._health),
            ("GET", "/metrics", self._metrics),
            ("GET", "/sim/stats", self._stats),
            ("GET", "/sim/heard", self._heard),
            ("GET", "/sim/bodies", self._bodies),
            ("POST", "/sim/reset", self._reset),
            ("GET", "/sim/faults", self._faults_get),
            ("POST", "/sim/faults", self._faults_post),
            ("DELETE", "/sim/faults", self._faults_delete),
        ]
        for method, path, handler in routes:
            self.app.add(method, path, handler)

    async def _startup(self) -> None:
        logging.getLogger("uvicorn.error").addFilter(_QUIET_DROPS)
        self.engine.start()

    def stats(self) -> dict[str, int]:
        counters = self.engine.counters
        load = self.engine.load()
        return {
            "received": self.received,
            "started": counters.started,
            "completed": counters.completed,
            "cancelled": counters.cancelled,
            "failed": self.failed,
            "running": load.running,
            "waiting": load.waiting,
            "max_in_flight": counters.max_in_flight,
            "max_running": counters.max_running,
        }

    # Inference routes

    def _inference(self, handler: PayloadHandler) -> Handler:
        """Wrap an inference handler with counting, faults, auth, body parsing and errors."""

        async def route(scope: Scope, receive: Receive, send: Send) -> None:
            self.received += 1
            self.heard.append({name: _text(header(scope, name.encode())) for name in _TRACED})
            faults = self.options.faults
            try:
                if faults.redirect_to is not None:
                    await redirect(send, faults.redirect_to)
                    return
                refusal = self.injector.refusal()
                if refusal is not None:
                    self.failed += 1
                    raise refusal
                self._authorize(scope)
                payload = load_object(await read_body(receive, MAX_BODY_BYTES))
                self.bodies.append(payload)
                if faults.body_lie is not None:
                    await self._lie(faults.body_lie, payload, send)
                    return
                await handler(payload, receive, send)
            except GatewayError as err:
                headers = throttle_headers(err, faults.retry_after_header)
                await send_bytes(send, err.status, error_body(err), headers)
            except Rejected as exc:
                await send_error(send, bad_request(exc.message, exc.code))
            except ClientDisconnected:
                pass

        return route

    async def _chat(self, payload: Payload, receive: Receive, send: Send) -> None:
        request = parse_chat(payload, self.options.engine.default_max_tokens, self._caching)
        if request.model in self.options.guard_models:
            await self._guard(request, chat_contents(payload), receive, send)
            return
        await self._generate("chat", request, receive, send)

    async def _guard(
        self, request: GenerationRequest, texts: list[str], receive: Receive, send: Send
    ) -> None:
        """A guard model's verdict, timed by the engine as an answer of its length."""
        if request.stream:
            raise bad_request("the simulator's guard models answer non-streamed requests only")
        answer = guard.verdict(texts)
        tokens = min(request.max_tokens, len(answer.split()))
        seq = self.engine.submit(
            request.model, request.prompt_tokens, tokens, priority=request.priority,
            hang=self.options.faults.hang,
        )  # fmt: skip
        response_id = f"chatcmpl-{next(self._ids)}"
        try:
            await self._respond(
                lambda: completion_body(
                    "chat", response_id, int(time.time()), request.model,
                    request.prompt_tokens, tokens, answer,
                ),
                seq, None, receive, send,
            )  # fmt: skip
        finally:
            self.engine.cancel(seq)

    async def _completion(self, payload: Payload, receive: Receive, send: Send) -> None:
        request = parse_completion(payload, self.options.engine.default_max_tokens, self._caching)
        await self._generate("completion", request, receive, send)

    async def _generate(
        self, kind: Kind, request: GenerationRequest, receive: Receive, send: Send
    ) -> None:
        self._check_model(request.model)
        faults, prompt = self.options.faults, request.text
        seq = self.engine.submit(
            request.model,
            request.prompt_tokens,
            request.max_tokens,
            priority=request.priority,
            hang=faults.hang,
            text=None if prompt is None else lambda generated: prompt + text(generated),
        )
        response_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{next(self._ids)}"
        # A response longer than N tokens is cut right after its N-th token.
        drop_after = faults.drop_after_tokens
        cut = drop_after if drop_after is not None and drop_after < request.max_tokens else None
        try:
            if request.stream:
                events = StreamEvents(kind, response_id, int(time.time()), request.model)
                await self._stream(events, request, seq, cut, receive, send)
            else:
                await self._respond(
                    lambda: completion_body(
                        kind, response_id, int(time.time()), request.model,
                        request.prompt_tokens, seq.generated,
                    ),
                    seq, cut, receive, send,
                )  # fmt: skip
        finally:
            self.engine.cancel(seq)

    async def _respond(
        self,
        body: Callable[[], bytes],
        seq: Sequence,
        cut: int | None,
        receive: Receive,
        send: Send,
    ) -> None:
        """Answer once the sequence finished (or cut the connection at `cut` tokens); the
        body is rendered only then, from what was generated."""
        async with DisconnectWatcher(receive):
            if cut is None:
                await seq.wait_finished()
            else:
                await seq.wait_for(cut)
        if cut is not None:
            await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
            self._drop()
        await send_bytes(send, 200, body(), JSON_HEADERS)

    async def _stream(
        self,
        events: StreamEvents | MessageEvents,
        request: GenerationRequest,
        seq: Sequence,
        cut: int | None,
        receive: Receive,
        send: Send,
    ) -> None:
        limit = request.max_tokens if cut is None else cut
        sent = 0
        async with DisconnectWatcher(receive):
            # As vLLM does, nothing (not even the headers) goes out before the first token
            # exists, so the first byte a client sees marks the real time to first token.
            await seq.wait(0)
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            if events.opening:
                await send(_part(events.opening))
            while sent < limit:
                await seq.wait(sent)
                ready = min(seq.generated, limit)
                if ready == limit:
                    break
                await send(_part(events.tokens(sent, ready)))
                sent = ready
        # The last send completes the response, so it stays outside the watcher: once the
        # response is complete, uvicorn's receive() reports a disconnect.
        rest = events.tokens(sent, limit)
        if cut is not None:
            await send(_part(rest))
            self._drop()
        token_usage = usage(request.prompt_tokens, limit) if request.include_usage else None
        closing = (
            events.closing(token_usage, seq.timing())
            if isinstance(events, StreamEvents)
            else events.closing(token_usage)
        )
        await send({"type": "http.response.body", "body": rest + closing})

    async def _embedding(self, payload: Payload, receive: Receive, send: Send) -> None:
        request = parse_embedding(payload)
        self._check_model(request.model)
        seq = self.engine.submit(
            request.model,
            request.prompt_tokens,
            0,
            priority=request.priority,
            hang=self.options.faults.hang,
        )
        try:
            async with DisconnectWatcher(receive):
                await seq.wait_finished()
        finally:
            self.engine.cancel(seq)
        body = embedding_body(request.model, request.inputs, request.prompt_tokens, request.base64)
        await send_bytes(send, 200, body, JSON_HEADERS)

    async def _lie(self, lie: str, payload: Payload, send: Send) -> None:
        self.failed += 1
        try:
            await tell(send, lie, payload.get("stream") is True, self.options.models[0])
        except Cut:
            raise ConnectionDropped from None

    def _drop(self) -> NoReturn:
        self.failed += 1
        raise ConnectionDropped

    def _check_model(self, model: str) -> None:
        if model not in self.options.models:
            raise not_found(f"The model `{model}` does not exist.", "model_not_found")

    def _authorize(self, scope: Scope) -> None:
        if self._auth is not None and not hmac.compare_digest(
            header(scope, b"authorization") or b"", self._auth
        ):
            raise GatewayError(
                401, "invalid_api_key", "Incorrect API key provided.", ErrorType.AUTHENTICATION
            )

    # Other routes

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            self._authorize(scope)
        except GatewayError as err:
            await send_error(send, err)
            return
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "sluicegate-sim",
                "max_model_len": self.options.engine.max_model_len,
            }
            for name in self.options.models
        ]
        await send_json(send, 200, {"object": "list", "data": data})

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.injector.down_error()
        if refusal is not None:
            await send_error(send, refusal)
        else:
            await send_bytes(send, 200, b"", [])

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        faults = self.options.faults
        if faults.redirect_to is not None:
            await redirect(send, faults.redirect_to)
            return
        body = self.metrics.render()
        if faults.metrics_lie is not None:
            body = metrics_text(faults.metrics_lie, body)
        await send_bytes(send, 200, body, _METRICS_HEADERS)

    async def _stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.stats())

    async def _heard(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, list(self.heard))

    async def _bodies(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, list(self.bodies))

    async def _reset(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.received = 0
        self.failed = 0
        self.engine.reset_counters()
        await send_json(send, 200, self.stats())

    async def _faults_get(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.options.faults.as_dict())

    async def _faults_post(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            changes = load_object(await read_body(receive, MAX_BODY_BYTES))
            self.options.faults.merge(changes)
        except ClientDisconnected:
            return
        except GatewayError as err:
            await send_error(send, err)
            return
        except ValueError as exc:
            await send_error(send, bad_request(str(exc), "invalid_fault"))
            return
        await send_json(send, 200, self.options.faults.as_dict())

    async def _faults_delete(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.options.faults.reset()
        await send_json(send, 200, self.options.faults.as_dict())


HEARD = 256
_TRACED = ("x-request-id", "traceparent", "tracestate")


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")
