"""Checks on answers: whole bodies, streams through the hold-back, and parallel checks
an answer waits for or is cut by."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.core.guarding import Action, CheckerSpec, GuardrailSpec, Placement, default_failure
from sluicegate.guardrails.cache import DecisionCache
from sluicegate.guardrails.guard import Guardrail
from sluicegate.guardrails.output import OutputChecks, checked_body, checked_stream, cut_by
from sluicegate.guardrails.patterns import Patterns
from tests.support.clock import FakeClock

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def guardrail(pattern: str, action: Action = Action.BLOCK, window: int = 16) -> Guardrail:
    clock = FakeClock()
    spec = GuardrailSpec(
        "words",
        CheckerSpec("plugin", {}, 1.0),
        action,
        Placement.POST_CALL,
        default_failure(action),
        window=window,
        cache_ttl_s=0,
    )
    cache = DecisionCache(clock, b"s", "words", "v", 0, 0)
    return Guardrail(spec, Patterns({"bad": pattern}), clock, cache)


def token(text: str) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return b"data: " + orjson.dumps({**HEAD, "choices": [choice]}) + b"\n\n"


def tool(arguments: str) -> bytes:
    call = {"index": 0, "function": {"arguments": arguments}}
    choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
    return b"data: " + orjson.dumps({**HEAD, "choices": [choice]}) + b"\n\n"


FINISH = (
    b"data: "
    + orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    + b"\n\n"
)
DONE = b"data: [DONE]\n\n"


async def feed(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def run(
    g: Guardrail, chunks: list[bytes], window: int
) -> tuple[list[bytes], Exception | None]:
    out: list[bytes] = []
    try:
        async for chunk in checked_stream([g], window, feed(chunks)):
            out.append(chunk)
    except GatewayError as err:
        return out, err
    return out, None


def content(out: list[bytes]) -> str:
    text = ""
    for event in b"".join(out).split(b"\n\n"):
        if event.startswith(b"data: {"):
            for choice in orjson.loads(event[6:])["choices"]:
                delta = choice.get("delta", {})
                text += delta.get("content") or ""
                for call in delta.get("tool_calls") or ():
                    text += call["function"]["arguments"]
    return text


async def test_a_clean_stream_leaves_as_the_bytes_that_arrived() -> None:
    words = [" lorem", " ipsum", " dolor", " sit", " amet"]
    chunks = [token(w) for w in words] + [FINISH + DONE]
    out, err = await run(guardrail("tempor"), chunks, 6)
    assert err is None
    joined = b"".join(out)
    assert content(out) == "".join(words)
    assert joined.endswith(FINISH + DONE)
    assert token(" lorem") in joined


async def test_a_match_split_across_events_ends_the_stream_with_content_filter() -> None:
    words = [" lorem", " ipsum", " tem", "por inci", "didunt", " more"]
    out, err = await run(guardrail("tempor incididunt"), [token(w) for w in words], 17)
    assert err is not None
    assert err.code == "guardrail_blocked"
    assert "tempor" not in err.message
    text = content(out)
    assert "tem" not in text
    assert " lorem ipsum".startswith(text)
    last = orjson.loads(out[-1][6:])
    assert last["choices"][0]["finish_reason"] == "content_filter"
    assert last["id"] == "chatcmpl-1"


async def test_a_match_in_one_chunk_of_many_events_is_caught() -> None:
    words = [" lorem", " tempor", " incididunt", " more"]
    out, err = await run(guardrail("tempor incididunt"), [b"".join(token(w) for w in words)], 17)
    assert err is not None
    assert "tempor" not in content(out)


async def test_tool_call_arguments_are_checked() -> None:
    chunks = [tool('{"key": "sk-'), tool('abcdefgh"}')]
    out, err = await run(guardrail("sk-[a-z]{8}"), chunks, 11)
    assert err is not None
    assert "sk-" not in content(out)


async def test_the_client_is_never_more_than_the_window_behind() -> None:
    words = [f" w{i:02d}" for i in range(60)]
    seen, sent = 0, 0
    window = 10

    async def counted() -> AsyncIterator[bytes]:
        nonlocal seen
        for word in words:
            seen += len(word)
            yield token(word)

    async for chunk in checked_stream([guardrail("zzz")], window, counted()):
        sent += len(content([chunk]))
        assert seen - sent <= window
    assert sent == seen


async def test_a_mask_rewrites_the_stream_before_it_leaves() -> None:
    words = [" call", " 555", "12345", " now", " please"]
    out, err = await run(guardrail(r"\d{8}", Action.MASK), [token(w) for w in words], 8)
    assert err is None
    assert content(out) == " call [BAD] now please"


async def test_a_body_is_masked_or_refused() -> None:
    body = orjson.dumps(
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": "id 12345678 ok"}}]}
    )
    masked = orjson.loads(await checked_body([guardrail(r"\d{8}", Action.MASK)], body))
    assert masked["choices"][0]["message"]["content"] == "id [BAD] ok"
    assert await checked_body([guardrail("absent")], body) is body
    with pytest.raises(GatewayError) as caught:
        await checked_body([guardrail(r"\d{8}")], body)
    assert "12345678" not in caught.value.message


async def test_an_answer_waits_for_its_parallel_checks_unless_it_may_be_cut() -> None:
    check: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(OutputChecks((), 0, check).ready())
    await asyncio.sleep(0)
    assert not waiting.done()
    check.set_result(None)
    await waiting
    pending: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    await OutputChecks((), 0, pending, cut=True).ready()
    pending.cancel()


async def test_a_failed_parallel_check_refuses_the_answer() -> None:
    check: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    check.set_exception(GatewayError(400, "guardrail_blocked", "no", "invalid_request_error"))  # type: ignore[arg-type]
    with pytest.raises(GatewayError):
        await OutputChecks((), 0, check).ready()
    with pytest.raises(GatewayError):
        await OutputChecks((), 0, check).body(b"{}")


async def test_a_stream_allowed_to_be_cut_is_cut_when_its_check_fails() -> None:
    check: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    got: list[bytes] = []

    async def upstream() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"
        check.set_exception(GatewayError(400, "guardrail_blocked", "no", "invalid_request_error"))  # type: ignore[arg-type]
        yield b"c"
        yield b"d"

    async def read() -> None:
        async for chunk in cut_by(check, upstream()):
            got.append(chunk)

    with pytest.raises(GatewayError):
        await read()
    assert got == [b"a"]


async def test_a_stream_allowed_to_be_cut_ends_only_once_its_check_passed() -> None:
    check: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    stream = cut_by(check, feed([b"a", b"b"]))
    assert await anext(stream) == b"a"
    last = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert not last.done()
    check.set_result(None)
    assert await last == b"b"
