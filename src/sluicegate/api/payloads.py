"""Just enough validation of OpenAI request bodies to route them; the upstream checks the rest.

What the gateway itself reads (the token fields, `stream`) is checked strictly, and so is
nesting: orjson reads 1,024 levels but writes at most 254, so a body between the two
would parse here and fail when sent upstream.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.errors import bad_request
from sluicegate.core.types import Endpoint

MAX_DEPTH = 128
"""Arrays and objects nested deeper are refused; room is left under orjson's 254 for
what adapters wrap around a body."""

_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "n", "best_of")

_REQUIRED = {
    Endpoint.CHAT: "messages",
    Endpoint.COMPLETIONS: "prompt",
    Endpoint.EMBEDDINGS: "input",
}


def json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(value, dict):
        raise bad_request("the body must be a JSON object")
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and _too_deep(value):
        raise bad_request(f"the body nests arrays and objects deeper than {MAX_DEPTH} levels")
    return value


def parse(endpoint: Endpoint, body: bytes, max_messages: int | None = None) -> dict[str, Any]:
    payload = json_object(body)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", param="model")
    field = _REQUIRED[endpoint]
    if field not in payload:
        raise bad_request(f"'{field}' is required", param=field)
    if endpoint is Endpoint.CHAT:
        messages = payload["messages"]
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty array", param="messages")
        if max_messages is not None and len(messages) > max_messages:
            raise bad_request(
                f"'messages' holds {len(messages)} messages; this route accepts at most "
                f"{max_messages}",
                param="messages",
            )
        if not all(isinstance(m, dict) for m in messages):
            raise bad_request("each item of 'messages' must be an object", param="messages")
    for name in _TOKEN_FIELDS:
        count = payload.get(name)
        if count is not None and (type(count) is not int or count < 0):
            raise bad_request(f"'{name}' must be a non-negative integer", param=name)
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    if stream and not endpoint.streams:
        raise bad_request(f"'{endpoint.value}' does not stream", param="stream")
    return payload


def _too_deep(value: object) -> bool:
    """Whether containers nest past `MAX_DEPTH`; iterative, so it cannot exhaust the stack."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            return True
        inner = item.values() if isinstance(item, dict) else item
        pending.extend((v, depth + 1) for v in inner if isinstance(v, dict | list))
    return False
