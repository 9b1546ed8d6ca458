"""Every Retry-After the gateway writes is a real, bounded wait, whoever named it."""

from __future__ import annotations

import math

import pytest

from sluicegate.api.asgi import error_headers
from sluicegate.core.errors import MAX_RETRY_AFTER_S, ErrorType, GatewayError
from sluicegate.core.refusals import Refusal


def throttled(retry_after_s: float) -> GatewayError:
    return GatewayError(
        503, "upstream_throttled", "m", ErrorType.UNAVAILABLE, retry_after_s=retry_after_s
    )


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf])
def test_a_non_finite_retry_after_is_dropped_and_renders(seconds):
    err = throttled(seconds)
    assert err.retry_after_s is None
    assert b"retry-after" not in dict(error_headers(err))


def test_a_retry_after_is_clamped_where_it_is_written():
    headers = dict(error_headers(throttled(1e9)))
    assert headers[b"retry-after"] == str(int(MAX_RETRY_AFTER_S)).encode()
    assert dict(error_headers(throttled(-3)))[b"retry-after"] == b"0"


def test_a_refusal_without_end_still_says_not_to_retry():
    err = Refusal.POOL_RATE.error("m", math.inf)
    assert (err.retry_after_s, err.should_retry) == (None, False)
