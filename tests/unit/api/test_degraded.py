"""The degraded-store mark on every response, read when the answer starts."""

from __future__ import annotations

from sluicegate.api.degraded import DEGRADED_HEADER, mark_degraded


async def test_a_response_started_while_degraded_carries_the_mark_and_others_do_not():
    state = {"degraded": False}

    async def app(scope, receive, send):
        state["degraded"] = scope["path"] == "/goes-away"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b"{}"})

    marked = mark_degraded(app, lambda: state["degraded"])
    for path, expected in (
        ("/fine", [(b"a", b"b")]),
        ("/goes-away", [(b"a", b"b"), DEGRADED_HEADER]),
    ):
        sent: list[dict] = []

        async def send(message, sent=sent):
            sent.append(message)

        await marked({"type": "http", "path": path}, None, send)
        assert sent[0]["headers"] == expected
        assert sent[1] == {"type": "http.response.body", "body": b"{}"}
