"""Reading back a relayed stream, and the body that continues it (`providers.resume`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from sluicegate.core.call import Call
from sluicegate.core.types import Deployment, Endpoint, Lane, Model, RoutePolicy, Tenant, Timeouts
from sluicegate.providers.base import classify_status
from sluicegate.providers.resume import (
    FOLD_AFTER,
    SoFar,
    continuation,
    ends_event,
    finishing,
    resumable,
    without_opening,
)
from sluicegate.providers.transport import Transport

DEPLOYMENT = Deployment(
    "d", "openai", "http://127.0.0.1:9/v1", "m", None, Timeouts(1, 1, 1), 8, ("p",), resumable=True
)


def event(delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


def call(**payload) -> Call:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **payload}
    return Call(
        Endpoint.CHAT, Tenant("t", None), Model("m", (DEPLOYMENT,)), RoutePolicy(), Lane("l"),
        body, True, 0.0, 10.0, 5, 20,
    )  # fmt: skip


def so_far(*chunks: bytes) -> tuple[str, int] | None:
    kept = SoFar()
    for chunk in chunks:
        kept.add(chunk)
    return kept.answered()


def test_the_answer_so_far_is_read_back_from_events_cut_anywhere():
    stream = event({"role": "assistant", "content": ""}) + event({"content": "Hel"})
    stream += event({"content": "lo"}) + event({"content": ""}) + b": keep-alive\n\n"
    assert so_far(*(stream[i : i + 7] for i in range(0, len(stream), 7))) == ("Hello", 2)


def test_a_long_answer_is_kept_as_its_text_not_its_events():
    """Ten thousand one-token events of about 80 bytes each: what is kept grows by the
    text, two bytes an event, not by the events."""
    kept = SoFar()
    for _ in range(10_000):
        kept.add(event({"content": "ab"}))
    assert kept.held_bytes() <= 20_000 + FOLD_AFTER
    assert kept.answered() == ("ab" * 10_000, 10_000)


def test_the_tokens_produced_are_the_backends_own_count_where_it_reports_one():
    """An event may carry several tokens: a stream whose events report usage is counted
    by it, not by its events."""
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    tail = b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n"
    assert so_far(event({"content": "Hello"}), event({"content": " you"}), tail) == (
        "Hello you",
        7,
    )


@pytest.mark.parametrize(
    "delta",
    [
        {"reasoning_content": "let me think"},
        {"tool_calls": [{"index": 0, "function": {"name": "f"}}]},
        {"refusal": "no"},
    ],
)
def test_an_answer_with_more_than_text_so_far_is_not_read_back(delta):
    stream = event({"role": "assistant", "content": ""}) + event(delta) + event({"content": "x"})
    assert so_far(stream) is None
    assert so_far(event({"content": "x", "reasoning_content": None})) == ("x", 1)


def test_the_continuation_asks_for_what_is_left_of_each_cap():
    payload = call(max_tokens=10, max_completion_tokens=8).payload
    body = continuation(payload, "Hello", 3)
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert (body["max_tokens"], body["max_completion_tokens"]) == (7, 5)
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    assert len(payload["messages"]) == 1, "the caller's payload is not written to"


def test_the_continuation_asks_for_what_is_left_of_the_least_output():
    """`min_tokens` counts the whole answer: the continuation owes only what the answer
    so far has not produced."""
    assert continuation(call(min_tokens=5).payload, "Hello", 3)["min_tokens"] == 2
    assert continuation(call(min_tokens=2).payload, "Hello", 3)["min_tokens"] == 0


@pytest.mark.parametrize(
    ("change", "may"),
    [
        ({}, True),
        ({"n": 2}, False),
        ({"tools": [{"type": "function"}]}, False),
        ({"logprobs": True}, False),
        ({"continue_final_message": True}, False),
        ({"response_format": {"type": "json_object"}}, False),
        ({"response_format": {"type": "text"}}, True),
        ({"guided_json": {"type": "object"}}, False),
        ({"min_tokens": 1}, True),
        ({"min_tokens": 5}, True),
        ({"echo": True}, False),
    ],
)
def test_only_a_plain_streamed_chat_answer_on_a_resumable_deployment_may_be_resumed(change, may):
    """Judged on what changes the continuation alone: a least output carries over (less
    what was produced) and a plain-text response format is no format."""
    assert resumable(call(**change), DEPLOYMENT) is may


def test_not_on_a_deployment_that_cannot_continue_nor_for_a_whole_answer():
    assert not resumable(call(), dataclasses.replace(DEPLOYMENT, resumable=False))
    assert not resumable(call()._replace(stream=False), DEPLOYMENT)


def test_a_stream_stops_only_after_a_whole_event_and_never_once_it_finishes():
    assert ends_event(event({"content": "a"}))
    assert not ends_event(event({"content": "a"})[:-1])
    assert not finishing(event({"content": "a"}))
    assert finishing(event({}, "stop"))
    assert finishing(b"data: [DONE]\n\n")


def test_the_continued_stream_drops_only_its_opening():
    opening, word = event({"role": "assistant", "content": ""}), event({"content": "x"})
    assert without_opening(opening + word) == word
    assert without_opening(word + opening) == word + opening


async def test_a_call_ended_to_hand_its_slot_over_keeps_no_grace():
    """An abandoned call keeps its permits `cancel_grace_s` (here 30 s) more; one whose
    slot is handed over ends at once."""

    stop = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(event({"content": "x"}))
        await stop.wait()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base_url = f"http://127.0.0.1:{port}/v1"
    deployment = dataclasses.replace(DEPLOYMENT, base_url=base_url, cancel_grace_s=30.0)
    transport = Transport(deployment, {})
    await transport.start()
    try:
        url = f"{base_url}/chat/completions"
        async with asyncio.timeout(5):
            async with transport.post(url, b"{}", 10, classify_status, True) as body:
                chunks: AsyncIterator[bytes] = body.chunks()
                assert await anext(chunks) == event({"content": "x"})
                body.handed_over = True
    finally:
        stop.set()
        await transport.close()
        await runner.cleanup()
