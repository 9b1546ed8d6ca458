"""Anthropic Messages answers rewritten as OpenAI `chat.completion` objects.

Malformed input raises KeyError or TypeError; the adapter reports it as the upstream's fault.
"""

from __future__ import annotations

from typing import Any

import orjson

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_PROMPT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def finish_reason(stop_reason: object) -> str:
    """OpenAI's finish reason; a stop reason Anthropic adds later reads as a plain stop."""
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def prompt_tokens(usage: dict[str, Any]) -> int:
    """All input tokens: Anthropic counts cache writes and reads apart from `input_tokens`,
    OpenAI's `prompt_tokens` includes them."""
    return sum(usage.get(name) or 0 for name in _PROMPT_FIELDS)


def cached_tokens(usage: dict[str, Any]) -> int | None:
    """Input tokens read from Anthropic's prompt cache (billed at its cached price)."""
    read = usage.get("cache_read_input_tokens")
    return read if isinstance(read, int) else None


def openai_usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def chat_completion(message: dict[str, Any], created: int) -> dict[str, Any]:
    """The `chat.completion` for a Messages answer; Anthropic's message id is kept."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message["content"]:
        if block["type"] == "text":
            texts.append(block["text"])
        elif block["type"] == "tool_use":
            calls.append(_tool_call(block))
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        reply["tool_calls"] = calls
    usage = message["usage"]
    choice = {
        "index": 0,
        "message": reply,
        "logprobs": None,
        "finish_reason": finish_reason(message.get("stop_reason")),
    }
    return {
        "id": message["id"],
        "object": "chat.completion",
        "created": created,
        "model": message["model"],
        "choices": [choice],
        "usage": openai_usage(prompt_tokens(usage), usage.get("output_tokens") or 0),
    }


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = orjson.dumps(block["input"]).decode()
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }
