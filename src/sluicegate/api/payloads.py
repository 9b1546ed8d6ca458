"""Just enough validation of OpenAI request bodies to route them; the upstream checks the rest."""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.errors import bad_request
from sluicegate.core.types import Endpoint

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
    return value


def parse(endpoint: Endpoint, body: bytes) -> dict[str, Any]:
    payload = json_object(body)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string")
    field = _REQUIRED[endpoint]
    if field not in payload:
        raise bad_request(f"'{field}' is required")
    if endpoint is Endpoint.CHAT:
        messages = payload["messages"]
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty array")
        if not all(isinstance(m, dict) for m in messages):
            raise bad_request("each item of 'messages' must be an object")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean")
    if stream and not endpoint.streams:
        raise bad_request(f"'{endpoint.value}' does not stream")
    return payload
