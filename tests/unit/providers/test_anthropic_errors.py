from __future__ import annotations

import orjson
import pytest

from sluicegate.core.errors import ErrorType
from sluicegate.providers.anthropic_errors import classify


def body(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


@pytest.mark.parametrize(
    ("status", "kind", "expected_status", "code"),
    [
        (400, "invalid_request_error", 400, "invalid_request"),
        (401, "authentication_error", 502, "upstream_misconfigured"),
        (403, "permission_error", 502, "upstream_misconfigured"),
        (404, "not_found_error", 502, "upstream_misconfigured"),
        (413, "request_too_large", 400, "invalid_request"),
        (429, "rate_limit_error", 503, "upstream_throttled"),
        (500, "api_error", 502, "upstream_error"),
        (529, "overloaded_error", 503, "upstream_unavailable"),
    ],
)
def test_anthropic_statuses_map_to_what_the_caller_should_see(status, kind, expected_status, code):
    err = classify("claude", status, body(kind, "boom"), {})
    assert (err.status, err.code) == (expected_status, code)
    assert "boom" in err.message


def test_throttling_keeps_anthropic_retry_after():
    err = classify("claude", 429, body("rate_limit_error", "slow down"), {"retry-after": "12"})
    assert err.retry_after_s == 12
    assert err.error_type is ErrorType.UNAVAILABLE


def test_overload_is_retryable_unavailability():
    err = classify("claude", 529, body("overloaded_error", "Overloaded"), {})
    assert err.error_type is ErrorType.UNAVAILABLE
    assert err.should_retry is None


@pytest.mark.parametrize(
    "message",
    [
        "prompt is too long: 215000 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000, "
        "decrease input length or `max_tokens` and try again",
    ],
)
def test_a_prompt_too_long_gets_openai_context_length_code(message):
    err = classify("claude", 400, body("invalid_request_error", message), {})
    assert (err.status, err.code, err.should_retry) == (400, "context_length_exceeded", False)
    assert err.message == message
