"""The simulator's Anthropic face: `POST /v1/messages` on the same engine as the OpenAI face.

The gateway's Anthropic adapter needs a local Anthropic-shaped backend whose timing and
failures are the simulator's own. Counting, faults, the streaming loop, cuts and
disconnects are shared with the OpenAI face; the request and answer shapes, the event
sequence and the error vocabulary are Anthropic's. Tokens are counted as the OpenAI face
counts them, so the same conversation costs the same on either face.
"""

from __future__ import annotations

import hmac
import itertools
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from sluicegate.api.asgi import (
    JSON_HEADERS,
    ClientDisconnected,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_bytes,
)
from sluicegate.core.errors import ErrorType, GatewayError, bad_request, not_found
from sluicegate.sim.engine import Engine, Sequence
from sluicegate.sim.faults import FaultInjector
from sluicegate.sim.options import SimOptions
from sluicegate.sim.protocol import GenerationRequest, load_object
from sluicegate.sim.render import WORDS, text

MAX_BODY_BYTES = 32 * 1024 * 1024
"""Anthropic's own limit on a Messages request."""
OVERLOADED = 529
TOOL_TRIGGER = "call a tool"
"""Text in the last user message that makes the simulated model call a tool (auto choice)."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    OVERLOADED: "overloaded_error",
}
_SAMPLE_VALUES: dict[str, Any] = {
    "string": "sim",
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "array": [],
    "object": {},
    "null": None,
}
_FRAGMENT_CHARS = 4


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The one tool call the simulated model makes; its input arrives a fragment per token."""

    name: str
    input: dict[str, Any]
    fragments: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    tool: ToolUse | None

    @property
    def output_tokens(self) -> int:
        """Text runs to `max_tokens`; a tool call ends with its input, if that fits."""
        return (
            self.max_tokens if self.tool is None else min(len(self.tool.fragments), self.max_tokens)
        )

    @property
    def stop_reason(self) -> str:
        complete = self.tool is not None and len(self.tool.fragments) <= self.max_tokens
        return "tool_use" if complete else "max_tokens"


# Requests


def parse_messages(payload: dict[str, Any]) -> MessagesRequest:
    """The Messages request reduced to what the engine needs; a 400 for a bad one."""
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model: Field required")
    max_tokens = payload.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad_request("max_tokens: Field required, an integer >= 1")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: Field required, a non-empty array")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise bad_request("messages: each message needs the role user or assistant")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream: Input should be a valid boolean")
    chars = _chars(payload.get("system")) + sum(_chars(m.get("content")) for m in messages)
    prompt_tokens = -(-chars // 4)
    return MessagesRequest(model, prompt_tokens, max_tokens, stream, _tool_use(payload, messages))


def _chars(content: object) -> int:
    """Characters of text and tool results: what the OpenAI face counts for the same chat."""
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        return 0
    total = 0
    for block in content:
        if not isinstance(block, dict):
            raise bad_request("content: each block must be an object")
        if block.get("type") == "text":
            total += len(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            total += _chars(block.get("content"))
    return total


def _tool_use(payload: dict[str, Any], messages: list[dict[str, Any]]) -> ToolUse | None:
    tools = payload.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(tool, dict) and isinstance(tool.get("name"), str) for tool in tools
    ):
        raise bad_request("tools: each tool needs a string name")
    choice = payload.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "none" or (kind == "auto" and TOOL_TRIGGER not in _last_user_text(messages)):
        return None
    if kind == "tool":
        tools = [tool for tool in tools if tool["name"] == choice.get("name")]
    elif kind not in ("any", "auto"):
        raise bad_request("tool_choice.type: must be auto, any, tool or none")
    if not tools:
        raise bad_request("tool_choice.name: no tool of that name")
    arguments = _sample_input(tools[0].get("input_schema"))
    encoded = orjson.dumps(arguments).decode()
    fragments = tuple(
        encoded[start : start + _FRAGMENT_CHARS]
        for start in range(0, len(encoded), _FRAGMENT_CHARS)
    )
    return ToolUse(tools[0]["name"], arguments, fragments)


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    last = messages[-1]
    if last["role"] != "user":
        return ""
    content = last.get("content")
    if isinstance(content, str):
        return content
    blocks = content if isinstance(content, list) else []
    return " ".join(str(block.get("text", "")) for block in blocks if block.get("type") == "text")


def _sample_input(schema: object) -> dict[str, Any]:
    """A fixed value per property type, so the arguments are valid for simple schemas."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return {}
    return {name: _sample(spec) for name, spec in properties.items()}


def _sample(spec: object) -> Any:
    if not isinstance(spec, dict):
        return "sim"
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return spec["enum"][0]
    kind = spec.get("type")
    return _SAMPLE_VALUES.get(kind, "sim") if isinstance(kind, str) else "sim"


# Answers


def message_body(message_id: str, tool_id: str, request: MessagesRequest) -> bytes:
    """A whole non-streamed message; a tool call cut by `max_tokens` has an empty input."""
    tool = request.tool
    if tool is None:
        block: dict[str, Any] = {"type": "text", "text": text(request.output_tokens)}
    else:
        complete = request.stop_reason == "tool_use"
        block = _tool_block(tool_id, tool, tool.input if complete else {})
    message = _message(message_id, request, request.stop_reason, request.output_tokens)
    return orjson.dumps({**message, "content": [block]})


def _message(
    message_id: str, request: MessagesRequest, stop_reason: str | None, output_tokens: int
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": [],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": request.prompt_tokens, "output_tokens": output_tokens},
    }


def _tool_block(tool_id: str, tool: ToolUse, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": tool.name, "input": arguments}


def _event(data: dict[str, Any]) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _delta(delta: dict[str, str]) -> bytes:
    return _event({"type": "content_block_delta", "index": 0, "delta": delta})


_TEXT_DELTAS = tuple(_delta({"type": "text_delta", "text": word}) for word in WORDS)
_PING = _event({"type": "ping"})
_BLOCK_STOP = _event({"type": "content_block_stop", "index": 0})
_MESSAGE_STOP = _event({"type": "message_stop"})


class MessageEvents:
    """The SSE events of one streamed message in Anthropic's order, one delta per token.

    It offers what `SimServer._stream` asks of OpenAI's `StreamEvents`, so one streaming
    loop (with its timing, cuts and disconnect handling) serves both faces."""

    __slots__ = ("_deltas", "_stop_reason", "opening")

    def __init__(self, message_id: str, tool_id: str, request: MessagesRequest) -> None:
        # As Anthropic does, message_start already counts one output token; the final
        # count in message_delta replaces it.
        start = {"type": "message_start", "message": _message(message_id, request, None, 1)}
        tool = request.tool
        if tool is None:
            block: dict[str, Any] = {"type": "text", "text": ""}
            self._deltas = _TEXT_DELTAS
        else:
            block = _tool_block(tool_id, tool, {})
            self._deltas = tuple(
                _delta({"type": "input_json_delta", "partial_json": part})
                for part in tool.fragments
            )
        block_start = {"type": "content_block_start", "index": 0, "content_block": block}
        self.opening = _event(start) + _event(block_start) + _PING
        self._stop_reason = request.stop_reason

    def tokens(self, start: int, stop: int) -> bytes:
        pieces = self._deltas
        size = len(pieces)
        return b"".join([pieces[index % size] for index in range(start, stop)])

    def closing(self, token_usage: dict[str, int] | None) -> bytes:
        """The block and message ends; the face always asks the loop for `token_usage`."""
        assert token_usage is not None, "the Anthropic face streams with include_usage"
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": token_usage["completion_tokens"]},
        }
        return _BLOCK_STOP + _event(delta) + _MESSAGE_STOP


async def send_error(send: Send, err: GatewayError) -> None:
    """`err` in Anthropic's shape; unavailability is its 529 overloaded_error."""
    status = OVERLOADED if err.status == 503 else err.status
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    body = orjson.dumps({"type": "error", "error": {"type": kind, "message": err.message}})
    headers = list(JSON_HEADERS)
    if err.retry_after_s is not None:
        headers.append((b"retry-after", str(math.ceil(err.retry_after_s)).encode()))
    await send_bytes(send, status, body, headers)


# The route


class SimHost(Protocol):
    """What the face shares with the simulator that hosts it."""

    options: SimOptions
    engine: Engine
    injector: FaultInjector
    received: int
    failed: int


StreamLoop = Callable[
    [MessageEvents, GenerationRequest, Sequence, int | None, Receive, Send], Awaitable[None]
]
Respond = Callable[[Callable[[], bytes], Sequence, int | None, Receive, Send], Awaitable[None]]


class MessagesFace:
    """`route` serves `POST /v1/messages`; `stream` and `respond` are the host's own."""

    def __init__(self, host: SimHost, stream: StreamLoop, respond: Respond) -> None:
        self._host = host
        self._stream = stream
        self._respond = respond
        self._ids = itertools.count(1)
        key = host.options.api_key
        self._key = None if key is None else key.encode()

    async def route(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = self._host
        host.received += 1
        try:
            refusal = host.injector.refusal()
            if refusal is not None:
                host.failed += 1
                raise refusal
            self._authorize(scope)
            request = parse_messages(load_object(await read_body(receive, MAX_BODY_BYTES)))
            await self._generate(request, receive, send)
        except GatewayError as err:
            await send_error(send, err)
        except ClientDisconnected:
            pass

    def _authorize(self, scope: Scope) -> None:
        if self._key is not None and not hmac.compare_digest(
            header(scope, b"x-api-key") or b"", self._key
        ):
            raise GatewayError(
                401, "invalid_api_key", "invalid x-api-key", ErrorType.AUTHENTICATION
            )
        if header(scope, b"anthropic-version") is None:
            raise bad_request("anthropic-version: header is required")

    async def _generate(self, request: MessagesRequest, receive: Receive, send: Send) -> None:
        host = self._host
        if request.model not in host.options.models:
            raise not_found(f"model: {request.model}")
        limit = host.options.engine.max_model_len
        if request.prompt_tokens + request.max_tokens > limit:
            raise bad_request(_too_long(request, limit))
        faults = host.options.faults
        seq = host.engine.submit(
            request.model, request.prompt_tokens, request.output_tokens, hang=faults.hang
        )
        number = next(self._ids)
        message_id, tool_id = f"msg_sim{number}", f"toolu_sim{number}"
        # A response longer than N tokens is cut right after its N-th token.
        drop_after = faults.drop_after_tokens
        length = request.output_tokens
        cut = drop_after if drop_after is not None and drop_after < length else None
        try:
            if request.stream:
                events = MessageEvents(message_id, tool_id, request)
                generation = GenerationRequest(
                    model=request.model,
                    prompt_tokens=request.prompt_tokens,
                    max_tokens=length,
                    stream=True,
                    include_usage=True,
                    priority=0,
                )
                await self._stream(events, generation, seq, cut, receive, send)
            else:
                await self._respond(
                    lambda: message_body(message_id, tool_id, request), seq, cut, receive, send
                )
        finally:
            host.engine.cancel(seq)


def _too_long(request: MessagesRequest, limit: int) -> str:
    """Anthropic's two messages: the prompt alone, or with max_tokens, is too long."""
    prompt, wanted = request.prompt_tokens, request.max_tokens
    if prompt > limit:
        return f"prompt is too long: {prompt} tokens > {limit} maximum"
    return (
        f"input length and `max_tokens` exceed context limit: {prompt} + {wanted} > {limit}, "
        "decrease input length or `max_tokens` and try again"
    )
