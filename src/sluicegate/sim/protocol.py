"""OpenAI request bodies reduced to what the engine needs, refusing bad ones with a 400.

Token counts are estimated as ceil(characters / 4), which is close enough to a real
tokenizer for capacity figures and costs nothing per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from sluicegate.core.errors import bad_request
from sluicegate.sim.engine import CHARS_PER_TOKEN


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A chat or text completion."""

    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: int
    text: str | None = None
    """The prompt as the engine's prefix cache sees it, when asked for (`rendered`)."""


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str, ...]
    prompt_tokens: int
    base64: bool
    priority: int


def load_object(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise bad_request("request body must be a JSON object")
    return payload


def parse_chat(
    payload: dict[str, Any], default_max_tokens: int, rendered: bool = False
) -> GenerationRequest:
    """A chat completion; `rendered`: with its prompt's text for a prefix cache."""
    messages = _message_texts(payload.get("messages"))
    chars = sum(len(content) for _, content in messages)
    max_tokens = _optional_int(payload, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _optional_int(payload, "max_tokens", 1)
    text = _chat_text(payload, messages) if rendered else None
    return _generation(payload, chars, max_tokens, default_max_tokens, text)


def parse_completion(
    payload: dict[str, Any], default_max_tokens: int, rendered: bool = False
) -> GenerationRequest:
    """A text completion; `rendered`: with its prompt's text for a prefix cache."""
    prompts = _strings(payload, "prompt")
    max_tokens = _optional_int(payload, "max_tokens", 1)
    text = "".join(prompts) if rendered else None
    return _generation(payload, sum(map(len, prompts)), max_tokens, default_max_tokens, text)


def parse_embedding(payload: dict[str, Any]) -> EmbeddingRequest:
    inputs = _strings(payload, "input")
    encoding = payload.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise bad_request("encoding_format must be 'float' or 'base64'")
    return EmbeddingRequest(
        model=_model(payload),
        inputs=inputs,
        prompt_tokens=_tokens(sum(map(len, inputs))),
        base64=encoding == "base64",
        priority=_priority(payload),
    )


def _generation(
    payload: dict[str, Any],
    chars: int,
    max_tokens: int | None,
    default_max_tokens: int,
    text: str | None,
) -> GenerationRequest:
    n = _optional_int(payload, "n", 1)
    if n not in (None, 1):
        raise bad_request("n must be 1: the simulator generates one choice per request")
    stream = _optional_bool(payload, "stream")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("stream_options must be an object")
    include_usage = _optional_bool(options, "include_usage") if options else False
    salt = payload.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise bad_request("cache_salt must be a string")
    if text is not None and salt:
        text = f"<|salt:{salt}|>{text}"
    return GenerationRequest(
        model=_model(payload),
        prompt_tokens=_tokens(chars),
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        stream=stream,
        include_usage=include_usage,
        priority=_priority(payload),
        text=text,
    )


def _tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def _model(payload: dict[str, Any]) -> str:
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model must be a non-empty string")
    return model


def _priority(payload: dict[str, Any]) -> int:
    value = payload.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request("priority must be an integer")
    return value


def _optional_int(payload: dict[str, Any], name: str, minimum: int) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad_request(f"{name} must be an integer >= {minimum}")
    return value


def _optional_bool(payload: dict[str, Any], name: str) -> bool:
    value = payload.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean")
    return value


def _strings(payload: dict[str, Any], name: str) -> tuple[str, ...]:
    value = payload.get(name)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise bad_request(f"{name} must be a string or a non-empty array of strings")


def _chat_text(payload: dict[str, Any], messages: list[tuple[str, str]]) -> str:
    """Each message's role and text, then the opening of the answer, unless the request
    asks to continue its final assistant message (vLLM's `continue_final_message`). An
    answer cut short and sent back that way so begins with the same blocks as the
    answer it continues."""
    text = "".join(f"<|{role}|>{content}" for role, content in messages)
    continues = payload.get("continue_final_message") is True and messages[-1][0] == "assistant"
    return text if continues else f"{text}<|assistant|>"


def chat_contents(payload: dict[str, Any]) -> list[str]:
    """The text of each message of a chat completion."""
    return [content for _, content in _message_texts(payload.get("messages"))]


def _message_texts(messages: object) -> list[tuple[str, str]]:
    """Each message's role and text, checked."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty array")
    texts = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(role := message.get("role"), str):
            raise bad_request("each message must be an object with a string role")
        content = message.get("content")
        if isinstance(content, str):
            texts.append((role, content))
        elif isinstance(content, list):
            texts.append((role, "".join(_part_text(part) for part in content)))
        elif content is None:
            texts.append((role, ""))
        else:
            raise bad_request("message content must be a string, an array of parts or null")
    return texts


def _part_text(part: object) -> str:
    """The text of a text part; other part types (images, audio) carry no text."""
    if not isinstance(part, dict):
        raise bad_request("each content part must be an object")
    if part.get("type") != "text":
        return ""
    text = part.get("text")
    if not isinstance(text, str):
        raise bad_request("a text content part needs a string text")
    return text
