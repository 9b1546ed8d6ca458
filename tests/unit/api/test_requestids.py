"""Every response names its request: the header on every answer, the id in every error
body, the client's own id kept when it is safe, the context gone after the request."""

from __future__ import annotations

import json

from sluicegate.api.asgi import Router
from sluicegate.api.requestids import with_request_ids
from sluicegate.core.ids import current, request_id

PARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def call(app, path: str, headers: list[tuple[bytes, bytes]]) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": headers}
    await app(scope, None, send)
    return sent


def header(message: dict, name: bytes) -> bytes | None:
    return dict(message["headers"]).get(name)


async def test_an_error_names_the_clients_request_id_in_its_header_and_its_body():
    sent = await call(with_request_ids(Router()), "/nowhere", [(b"x-request-id", b"req-42")])
    assert header(sent[0], b"x-request-id") == b"req-42"
    assert json.loads(sent[1]["body"])["error"]["request_id"] == "req-42"


async def test_an_unsafe_id_is_replaced_and_the_new_one_is_returned():
    sent = await call(with_request_ids(Router()), "/nowhere", [(b"x-request-id", b"a b")])
    made = header(sent[0], b"x-request-id")
    assert made is not None
    assert made != b"a b"
    assert json.loads(sent[1]["body"])["error"]["request_id"] == made.decode()


async def test_a_successful_answer_carries_the_id_and_the_app_sees_the_trace_context():
    seen = []

    async def app(scope, receive, send):
        seen.append(current.get())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b"{}"})

    headers = [(b"traceparent", PARENT), (b"tracestate", b"v=1")]
    sent = await call(with_request_ids(app), "/", headers)
    made = header(sent[0], b"x-request-id")
    assert (seen[0].request_id.encode(), seen[0].traceparent) == (made, PARENT.decode())
    assert seen[0].tracestate == "v=1"
    assert request_id() is None, "the request's context ends with it"


async def test_without_a_valid_traceparent_no_tracestate_is_kept():
    seen = []

    async def app(scope, receive, send):
        seen.append(current.get())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    await call(with_request_ids(app), "/", [(b"traceparent", b"bad"), (b"tracestate", b"v=1")])
    assert (seen[0].traceparent, seen[0].tracestate) == (None, None)


async def test_a_tracestate_that_is_not_printable_ascii_is_dropped():
    seen = []

    async def app(scope, receive, send):
        seen.append(current.get())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    await call(with_request_ids(app), "/", [(b"traceparent", PARENT), (b"tracestate", b"a\x01b")])
    assert (seen[0].traceparent, seen[0].tracestate) == (PARENT.decode(), None)
