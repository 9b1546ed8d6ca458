"""OpenAI chat-completion requests rewritten as Anthropic Messages requests.

The Messages API keeps the system prompt out of the conversation, carries tool calls and
tool results as content blocks inside user and assistant turns, and requires
`max_tokens`. Only the structure the rewrite walks through is checked here; the upstream
judges the values.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.errors import bad_request
from sluicegate.core.nesting import MAX_DEPTH, too_deep
from sluicegate.providers.anthropic_errors import unsupported

DEFAULT_MAX_TOKENS = 4096
"""Sent when the payload names no limit, since Anthropic requires one. The pipeline's
bodies always name one (the route's `max_output_tokens` when the caller set none)."""

MAX_TEMPERATURE = 1.0
"""Anthropic's range is 0..1 where OpenAI's is 0..2; higher values are clamped to it."""

_TOOL_CHOICES: dict[str, dict[str, Any]] = {
    "auto": {"type": "auto"},
    "none": {"type": "none"},
    "required": {"type": "any"},
}
_EMPTY_SCHEMA = {"type": "object", "properties": {}}

Block = dict[str, Any]
Turn = dict[str, Any]


def messages_request(payload: dict[str, Any], model: str) -> dict[str, Any]:
    """The Messages request for the chat-completion `payload`, addressed to `model`."""
    _refuse_unsupported(payload)
    system, turns = _conversation(_objects(payload["messages"], "messages"))
    request: dict[str, Any] = {"model": model, "max_tokens": _max_tokens(payload)}
    if system:
        request["system"] = system
    request["messages"] = turns
    if payload.get("tools"):
        request["tools"] = [_tool(tool) for tool in _objects(payload["tools"], "tools")]
    choice = _tool_choice(payload)
    if choice is not None:
        request["tool_choice"] = choice
    return request | _options(payload)


def include_usage(payload: dict[str, Any]) -> bool:
    """Whether a streaming caller asked for the final usage chunk."""
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _refuse_unsupported(payload: dict[str, Any]) -> None:
    """Refuse what would silently change the answer's meaning if it were dropped."""
    if payload.get("n") not in (None, 1):
        raise unsupported("n > 1")
    if payload.get("logprobs") or payload.get("top_logprobs"):
        raise unsupported("logprobs")
    response_format = payload.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        raise unsupported(f"response_format {response_format.get('type')!r}")


def _max_tokens(payload: dict[str, Any]) -> Any:
    for name in ("max_completion_tokens", "max_tokens"):
        if payload.get(name) is not None:
            return payload[name]
    return DEFAULT_MAX_TOKENS


def _options(payload: dict[str, Any]) -> dict[str, Any]:
    """Sampling, stop sequences, streaming and the end user, where the caller set them."""
    options: dict[str, Any] = {}
    temperature = payload.get("temperature")
    if isinstance(temperature, int | float):
        options["temperature"] = min(temperature, MAX_TEMPERATURE)
    if payload.get("top_p") is not None:
        options["top_p"] = payload["top_p"]
    stop = payload.get("stop")
    if stop:
        options["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if payload.get("stream") is True:
        options["stream"] = True
    if isinstance(payload.get("user"), str):
        options["metadata"] = {"user_id": payload["user"]}
    return options


def _conversation(messages: list[dict[str, Any]]) -> tuple[str, list[Turn]]:
    """The joined system prompt, and the turns with consecutive same-role messages merged:
    tool results answer in one user turn, as Anthropic requires."""
    system: list[str] = []
    turns: list[Turn] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_plain(message.get("content")))
            continue
        side, blocks = _turn(role, message)
        if turns and turns[-1]["role"] == side:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": side, "content": blocks})
    return "\n\n".join(system), turns


def _turn(role: object, message: dict[str, Any]) -> tuple[str, list[Block]]:
    if role == "user":
        return "user", _user_blocks(message.get("content"))
    if role == "assistant":
        calls = _objects(message.get("tool_calls") or [], "tool_calls")
        return "assistant", _text_blocks(message.get("content")) + [_tool_use(c) for c in calls]
    if role == "tool":
        return "user", [_tool_result(message)]
    raise bad_request(f"messages: unsupported role {role!r}")


def _user_blocks(content: object) -> list[Block]:
    if not isinstance(content, list):
        return _text_blocks(content)
    blocks: list[Block] = []
    for part in _objects(content, "content"):
        kind = part.get("type")
        if kind == "image_url":
            blocks.append(_image(part.get("image_url")))
        elif kind == "text":
            blocks.extend(_text_blocks(part.get("text")))
        else:
            raise unsupported(f"content parts of type {kind!r}")
    return blocks


def _image(image: object) -> Block:
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str):
        raise bad_request("image_url.url must be a string")
    if not url.startswith("data:"):
        return {"type": "image", "source": {"type": "url", "url": url}}
    media_type, _, data = url.removeprefix("data:").partition(";base64,")
    if not data:
        raise bad_request("an image data URL must be base64-encoded")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _text_blocks(content: object) -> list[Block]:
    """Anthropic refuses empty text blocks, which OpenAI callers send beside tool calls."""
    text = _plain(content)
    return [{"type": "text", "text": text}] if text else []


def _plain(content: object) -> str:
    """The text of string or text-part content (refusal parts included)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = _objects(content, "content")
    return "".join(str(part.get("text") or part.get("refusal") or "") for part in parts)


def _tool_use(call: dict[str, Any]) -> Block:
    function = call.get("function")
    if not isinstance(function, dict):
        raise bad_request("each tool call needs a function object")
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        raise bad_request("tool call arguments must be a JSON object") from None
    if not isinstance(arguments, dict):
        raise bad_request("tool call arguments must be a JSON object")
    if too_deep(arguments):
        raise bad_request(f"tool call arguments nest deeper than {MAX_DEPTH} levels")
    return {
        "type": "tool_use",
        "id": call.get("id"),
        "name": function.get("name"),
        "input": arguments,
    }


def _tool_result(message: dict[str, Any]) -> Block:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        raise bad_request("a tool message needs a string tool_call_id")
    return {
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": _plain(message.get("content")),
    }


def _tool(tool: dict[str, Any]) -> Block:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise unsupported(f"tools of type {tool.get('type')!r}")
    spec = {
        "name": function.get("name"),
        "input_schema": function.get("parameters") or _EMPTY_SCHEMA,
    }
    if function.get("description") is not None:
        spec["description"] = function["description"]
    return spec


def _tool_choice(payload: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's choice, plus `parallel_tool_calls: false`, which Anthropic keeps inside it."""
    choice = payload.get("tool_choice")
    serial = payload.get("parallel_tool_calls") is False and bool(payload.get("tools"))
    if choice is None and not serial:
        return None
    mapped = _mapped_choice("auto" if choice is None else choice)
    if serial and mapped["type"] != "none":
        mapped["disable_parallel_tool_use"] = True
    return mapped


def _mapped_choice(choice: object) -> dict[str, Any]:
    if isinstance(choice, str) and choice in _TOOL_CHOICES:
        return dict(_TOOL_CHOICES[choice])
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "tool", "name": choice["function"].get("name")}
    raise bad_request("tool_choice must be auto, none, required or a named function")


def _objects(value: object, name: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise bad_request(f"{name} must be an array of objects")
    return value
