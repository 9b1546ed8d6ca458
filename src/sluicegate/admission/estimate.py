"""Token estimates made before a request runs, for reservations and prompt budgets.

The default counts ceil(characters / 4): tokenizer tables (tiktoken) download on first
use, which fails offline. Any `Tokenizer` (text -> count) can replace it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluicegate.core.types import Endpoint

Tokenizer = Callable[[str], int]


def chars_over_four(text: str) -> int:
    return -(-len(text) // 4)


def prompt_tokens(endpoint: Endpoint, payload: dict[str, Any], count: Tokenizer) -> int:
    if endpoint is Endpoint.CHAT:
        return sum(_message_tokens(m.get("content"), count) for m in payload["messages"])
    field = payload["prompt" if endpoint is Endpoint.COMPLETIONS else "input"]
    return _message_tokens(field, count)


def output_tokens(endpoint: Endpoint, payload: dict[str, Any], route_cap: int) -> int:
    """The output to reserve: the request's own cap, else the route's."""
    if endpoint is Endpoint.EMBEDDINGS:
        return 0
    asked = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return asked
    return route_cap


def _message_tokens(content: object, count: Tokenizer) -> int:
    if isinstance(content, str):
        return count(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += count(part)
            elif isinstance(part, int):
                total += 1
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += count(part["text"])
        return total
    return 0
