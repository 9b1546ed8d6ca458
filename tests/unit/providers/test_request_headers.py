"""What an upstream is told of the request it serves: its id, unique per attempt (an
engine refuses a second request under a running one's id), and the caller's trace."""

from __future__ import annotations

import re

from sluicegate.core.ids import RequestContext, current
from sluicegate.providers.transport import request_headers

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_each_attempt_carries_the_request_id_with_a_suffix_of_its_own():
    token = current.set(RequestContext("req-1", PARENT, "v=1"))
    try:
        first, second = request_headers(), request_headers()
    finally:
        current.reset(token)
    assert first is not None
    assert second is not None
    assert re.fullmatch(r"req-1-[0-9a-f]{8}", first["x-request-id"])
    assert first["x-request-id"] != second["x-request-id"]
    assert (first["traceparent"], first["tracestate"]) == (PARENT, "v=1")


def test_without_a_trace_only_the_id_goes_and_outside_a_request_nothing():
    token = current.set(RequestContext("req-2"))
    try:
        headers = request_headers()
    finally:
        current.reset(token)
    assert headers is not None
    assert set(headers) == {"x-request-id"}
    assert request_headers() is None
