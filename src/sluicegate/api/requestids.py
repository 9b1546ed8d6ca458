"""Every HTTP request gets an id: the client's `x-request-id` when it is safe to repeat,
else a new one. It is set as the request's context (`core.ids`) before anything else
runs, so error bodies and log lines name it, and returned on every response.

A W3C `traceparent` the client sent (with its `tracestate`) is kept in the same context,
to be passed upstream.
"""

from __future__ import annotations

import re

from sluicegate.api.asgi import Handler, Message, Receive, Scope, Send
from sluicegate.core.ids import RequestContext, accepted_request_id, current, valid_traceparent

REQUEST_ID = b"x-request-id"
_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"
MAX_TRACESTATE = 512
"""The spec's own bound on what a vendor must pass on."""
_PRINTABLE = re.compile(rb"[\x20-\x7e]{1,%d}" % MAX_TRACESTATE)
"""A tracestate passed on as it came must be printable ASCII, within the bound."""


def context_of(headers: list[tuple[bytes, bytes]]) -> RequestContext:
    """The request's id and trace context from its headers (the first of each name)."""
    given = parent = state = None
    for name, value in headers:
        if name == REQUEST_ID:
            given = value if given is None else given
        elif name == _TRACEPARENT:
            parent = value if parent is None else parent
        elif name == _TRACESTATE:
            state = value if state is None else state
    traceparent = valid_traceparent(parent)
    tracestate = None
    if traceparent is not None and state is not None and _PRINTABLE.fullmatch(state):
        tracestate = state.decode()
    return RequestContext(accepted_request_id(given), traceparent, tracestate)


def with_request_ids(app: Handler) -> Handler:
    """`app`, each HTTP request running in its own context with its id set, and every
    response carrying `x-request-id`."""

    async def identified(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        context = context_of(scope["headers"])
        token = current.set(context)
        header = (REQUEST_ID, context.request_id.encode())

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            current.reset(token)

    return identified
