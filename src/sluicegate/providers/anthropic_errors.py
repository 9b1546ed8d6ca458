"""Anthropic's errors in the gateway's terms, so retries and fallbacks read one vocabulary."""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.errors import CONTEXT_LENGTH, GatewayError, bad_request
from sluicegate.providers.base import classify_status

OVERLOADED = 529
"""Anthropic's status for capacity exhausted across all its users: a retryable 503 here."""

_PROMPT_AND_OUTPUT_TOO_LONG = "exceed context limit"
"""Anthropic's wording when the prompt fits but the prompt plus `max_tokens` does not."""


def classify(deployment: str, status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError:
    """The statuses mean what OpenAI's do, except 529. A context too small is OpenAI's
    `context_length_exceeded` in both of Anthropic's wordings ("prompt is too long" is
    already recognised by `classify_status`), so a context-window fallback sees it."""
    err = classify_status(deployment, 503 if status == OVERLOADED else status, body, headers)
    if err.status == 400 and _PROMPT_AND_OUTPUT_TOO_LONG in err.message:
        err.code = CONTEXT_LENGTH
    return err


def unsupported(what: str) -> GatewayError:
    """A request the Messages API cannot express: the caller's 400, not the deployment's
    failure, so it neither trips the breaker nor moves down a fallback chain."""
    return bad_request(
        f"an Anthropic deployment does not support {what}", "unsupported_by_provider"
    )
