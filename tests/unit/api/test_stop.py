"""A stop cuts what its grace period left open: each request ends with an answer that
says why (an error event ends a started stream), one line each, and no traceback; and
the stop signal turns readiness off before anything else."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sluicegate.api.requestids import with_request_ids
from sluicegate.api.server import StoppingServer, server_config
from sluicegate.core.types import EdgeLimits
from tests.support.fakes import ScriptedProvider
from tests.unit.test_pipeline import config, running, settle

OPENING = b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'


class Endless:
    """An upstream stream that sends its first event and then nothing, ever."""

    used_tokens: int | None = None
    completion_tokens: int | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        yield OPENING
        await asyncio.Event().wait()


class Stalling(ScriptedProvider):
    @asynccontextmanager
    async def open(self, endpoint: Any, payload: dict[str, Any], budget_s: float):
        yield Endless()


async def ask(app, body: dict, sent: list[dict]) -> None:
    raw = json.dumps(body).encode()
    messages = iter([{"type": "http.request", "body": raw, "more_body": False}])

    async def receive() -> dict:
        try:
            return next(messages)
        except StopIteration:
            await asyncio.Event().wait()
            raise

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"authorization", b"Bearer sk-a"), (b"x-request-id", b"req-cut")],
    }
    await app(scope, receive, send)


async def test_a_stream_open_at_the_end_of_the_grace_period_ends_with_an_error_event(caplog):
    caplog.set_level(logging.WARNING)
    async with running(config({"name": "a"}), {}) as h:
        runtime = h.runtime
        runtime.pipeline._providers["a"] = Stalling(h.providers["a"].deployment)  # type: ignore[index]
        sent: list[dict] = []
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        request = asyncio.ensure_future(ask(runtime.app, body, sent))
        await settle(50)
        assert sent[1]["body"] == OPENING
        runtime.gateway.cut()
        await asyncio.wait_for(request, 5)
    last = sent[-1]
    assert not last.get("more_body"), "the error event ends the answer"
    error = json.loads(last["body"].removeprefix(b"data: "))["error"]
    assert (error["code"], error["request_id"]) == ("server_shutting_down", "req-cut")
    cuts = [r for r in caplog.records if "cut an open stream" in r.getMessage()]
    assert len(cuts) == 1
    assert not any(r.exc_info for r in caplog.records)


async def test_a_request_not_yet_answered_at_the_end_gets_a_503():
    async with running(config({"name": "a"}), {"a": "hang"}) as h:
        sent: list[dict] = []
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        request = asyncio.ensure_future(ask(h.runtime.app, body, sent))
        await settle(50)
        assert sent == []
        h.runtime.gateway.cut()
        await asyncio.wait_for(request, 5)
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"])["error"]["code"] == "server_shutting_down"


def test_the_stop_signal_turns_readiness_off_before_uvicorn_acts():
    calls: list[str] = []

    class Stopping:
        def begin(self) -> None:
            calls.append("begin")

        def cut(self) -> None:
            calls.append("cut")

    app = with_request_ids(lambda scope, receive, send: None)  # type: ignore[arg-type]
    server = StoppingServer(server_config(app, EdgeLimits()), Stopping(), grace_s=1)
    server.handle_exit(signal.SIGTERM, None)
    server.handle_exit(signal.SIGTERM, None)
    assert calls == ["begin"]
    assert server.should_exit
