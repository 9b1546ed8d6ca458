"""Which request the running code serves: its id and W3C trace context.

They travel in a context variable rather than as an argument threaded through every
layer: error bodies, log lines, upstream headers and the access log all name the
request, and each asyncio task copies the context it was created in, so a request's
attempts and hedges carry it too. The edge sets it for an HTTP request, the job worker
for a job's run and the library for an in-process call.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from typing import NamedTuple

MAX_REQUEST_ID = 128
"""The longest request id a client may choose; a longer one is replaced."""

_SAFE_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,%d}" % MAX_REQUEST_ID)
"""What a client's id may hold: enough for UUIDs, ULIDs and most vendors' ids, nothing
that could break a log line, a header or a JSON string."""

_TRACEPARENT = re.compile(rb"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
"""A W3C traceparent of version 00, with neither id all zeros (the spec's invalid ones)."""


class RequestContext(NamedTuple):
    request_id: str
    traceparent: str | None = None
    """The caller's W3C traceparent when it sent a valid one."""
    tracestate: str | None = None


current: ContextVar[RequestContext | None] = ContextVar("sluicegate_request", default=None)


def new_request_id() -> str:
    return os.urandom(12).hex()


def accepted_request_id(value: bytes | None) -> str:
    """The client's id when it is safe to repeat everywhere, else a new one."""
    if value is not None and _SAFE_ID.fullmatch(value):
        return value.decode()
    return new_request_id()


def valid_traceparent(value: bytes | None) -> str | None:
    """A traceparent is honoured only in the form the spec defines; any other is
    dropped, as the spec asks, rather than passed on half-understood."""
    if value is None:
        return None
    value = value.strip()
    return value.decode() if _TRACEPARENT.fullmatch(value) else None


def request_id() -> str | None:
    """The id of the request the running code serves, if any."""
    context = current.get()
    return None if context is None else context.request_id


def trace_id(traceparent: str | None) -> str | None:
    return None if traceparent is None else traceparent[3:35]
