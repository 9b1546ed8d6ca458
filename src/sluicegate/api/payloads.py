"""Just enough validation of OpenAI request bodies to route them; the upstream checks the rest.

What the gateway itself reads (the token fields, `stream`) is checked strictly, and so is
nesting (see `core.nesting`).
"""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.errors import bad_request
from sluicegate.core.nesting import MAX_DEPTH, too_deep
from sluicegate.core.types import Endpoint

_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "n", "best_of")
MAX_COUNT = 2**31 - 1
"""The most a token field may ask: more than any model generates, and small enough that
the gateway's sums of such counts (reservations, fair-share service) stay exact."""

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
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and too_deep(value):
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
        if count is not None and (type(count) is not int or not 0 <= count <= MAX_COUNT):
            raise bad_request(f"'{name}' must be an integer from 0 to {MAX_COUNT}", param=name)
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    if stream and not endpoint.streams:
        raise bad_request(f"'{endpoint.value}' does not stream", param="stream")
    return payload
