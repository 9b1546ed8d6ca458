"""The fallback ladder's request rewrites, applied while the gateway is degraded.

Each returns the names of the actions it took (the metric's `action` label): cheaper
answers for everyone beat failed answers for some.
"""

from __future__ import annotations

from typing import Any

from sluicegate.admission.estimate import Tokenizer, turn_tokens
from sluicegate.core.types import Endpoint, Ladder, Lane


def degrade(
    ladder: Ladder,
    lane: Lane,
    top: Lane,
    endpoint: Endpoint,
    payload: dict[str, Any],
    count: Tokenizer,
) -> list[str]:
    actions: list[str] = []
    if ladder.drop_n and (payload.get("n", 1) != 1 or "best_of" in payload):
        payload["n"] = 1
        payload.pop("best_of", None)
        actions.append("drop_n")
    cap = ladder.interactive_max_tokens
    if lane is top and cap is not None and endpoint is not Endpoint.EMBEDDINGS:
        field = "max_completion_tokens" if "max_completion_tokens" in payload else "max_tokens"
        asked = payload.get(field)
        if not isinstance(asked, int) or asked > cap:
            payload[field] = cap
            actions.append("cap_output")
    budget = ladder.trim_prompt_tokens
    if budget is not None and endpoint is Endpoint.CHAT and _trim(payload, budget, count):
        actions.append("trim_prompt")
    return actions


def _trim(payload: dict[str, Any], budget: int, count: Tokenizer) -> bool:
    """Drop the oldest turns (never system messages, never the last) until the prompt fits,
    in one pass with a running total: each turn is counted once."""
    messages: list[dict[str, Any]] = payload["messages"]
    rest, turns = turn_tokens(payload, count)
    total = rest + sum(turns)
    if total <= budget:
        return False
    kept: list[dict[str, Any]] = []
    for message, tokens in zip(messages[:-1], turns, strict=False):
        if total > budget and message.get("role") != "system":
            total -= tokens
        else:
            kept.append(message)
    kept.append(messages[-1])
    trimmed = len(kept) < len(messages)
    messages[:] = kept
    return trimmed
