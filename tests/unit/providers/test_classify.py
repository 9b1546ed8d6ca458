from __future__ import annotations

import pytest

from sluicegate.providers.base import classify_status


@pytest.mark.parametrize(
    ("status", "expected_status", "code"),
    [
        (400, 400, "bad_thing"),
        (401, 502, "upstream_misconfigured"),
        (404, 502, "upstream_misconfigured"),
        (429, 503, "upstream_throttled"),
        (500, 502, "upstream_error"),
        (503, 503, "upstream_unavailable"),
    ],
)
def test_upstream_statuses_map_to_what_the_caller_should_see(status, expected_status, code):
    body = b'{"error": {"message": "boom", "code": "bad_thing"}}'
    err = classify_status("dep", status, body, {})
    assert (err.status, err.code) == (expected_status, code)
    assert "boom" in err.message


def test_provider_retry_after_is_kept_and_ms_preferred():
    assert classify_status("d", 429, b"", {"retry-after": "7"}).retry_after_s == 7
    assert (
        classify_status("d", 429, b"", {"retry-after-ms": "1500", "retry-after": "2"}).retry_after_s
        == 1.5
    )
    assert classify_status("d", 429, b"", {}).retry_after_s is None
    assert classify_status("d", 429, b"", {"retry-after": "Wed, 21 Oct"}).retry_after_s is None


def test_non_json_upstream_body_still_gives_a_message():
    err = classify_status("d", 500, b"<html>oops</html>", {})
    assert "<html>oops" in err.message


@pytest.mark.parametrize("value", ["inf", "Infinity", "nan", "1e400", "-5"])
def test_a_retry_after_that_is_no_finite_wait_is_ignored(value):
    """`inf` once reached error rendering and turned the answer into a bare 500."""
    assert classify_status("d", 429, b"", {"retry-after": value}).retry_after_s is None
    assert classify_status("d", 503, b"", {"retry-after-ms": value}).retry_after_s is None


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_the_deployments_misconfiguration(status):
    err = classify_status("d", status, b"", {"location": "http://elsewhere/"})
    assert (err.status, err.code, err.failover) == (502, "upstream_misconfigured", True)
    assert "elsewhere" not in err.message
