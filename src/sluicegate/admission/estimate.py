"""Token estimates made before a request runs, for reservations and prompt budgets.

The default counts ceil(characters / 4): tokenizer tables (tiktoken) download on first
use, which fails offline. Any `Tokenizer` (text -> count) can replace it.

Everything the model reads is counted, not only `content`: every string (and object key)
under the prompt's fields, tools and function schemas included, and a token id or other
scalar as one token. A prompt hidden in `tools`, `tool_calls` arguments, `name`, a data
URL or a token array would otherwise pass budgets and reservations as nearly free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluicegate.core.types import Endpoint

Tokenizer = Callable[[str], int]

_PROMPT_FIELDS = {
    Endpoint.CHAT: ("messages", "tools", "functions", "response_format"),
    Endpoint.COMPLETIONS: ("prompt", "suffix"),
    Endpoint.EMBEDDINGS: ("input",),
}


def chars_over_four(text: str) -> int:
    return -(-len(text) // 4)


def prompt_tokens(endpoint: Endpoint, payload: dict[str, Any], count: Tokenizer) -> int:
    total = 0
    for field in _PROMPT_FIELDS[endpoint]:
        value = payload.get(field)
        if value is not None:
            total += _leaf_tokens(value, count)
    return total


def turn_tokens(payload: dict[str, Any], count: Tokenizer) -> tuple[int, list[int]]:
    """A chat prompt's tokens outside its messages, and each message's: together they make
    `prompt_tokens`, so turns can be dropped without counting the rest again."""
    rest = sum(
        _leaf_tokens(payload[field], count)
        for field in _PROMPT_FIELDS[Endpoint.CHAT]
        if field != "messages" and payload.get(field) is not None
    )
    return rest, [_leaf_tokens(message, count) for message in payload["messages"]]


def output_tokens(endpoint: Endpoint, payload: dict[str, Any], route_cap: int) -> int:
    """The output to reserve for one choice: the request's own cap, else the route's."""
    if endpoint is Endpoint.EMBEDDINGS:
        return 0
    asked = asked_output(payload)
    return route_cap if asked is None else asked


def asked_output(payload: dict[str, Any]) -> int | None:
    """The output the request itself caps each choice at; None when it names no usable
    cap, which lets the model write until it stops or its context is full."""
    asked = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return asked
    return None


def choices(payload: dict[str, Any]) -> int:
    """How many answers the upstream generates: `n`, or `best_of` when larger."""
    n, best_of = payload.get("n"), payload.get("best_of")
    if n is None and best_of is None:
        return 1
    return max(_count(n), _count(best_of))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def _leaf_tokens(value: object, count: Tokenizer) -> int:
    """Tokens of every string and object key under `value`; any other scalar is one.
    Iterative, so no nesting the parser accepted can exhaust the stack."""
    total = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += count(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                total += count(key)
                pending.append(inner)
        elif isinstance(item, list):
            pending.extend(item)
        elif item is not None:
            total += 1
    return total
