from __future__ import annotations

import orjson
import pytest
from openai.types.chat import ChatCompletionChunk

from sluicegate.providers.anthropic_stream import StreamBroken, StreamTranslator


def sse(*events: dict) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\r\ndata: " + orjson.dumps(e) + b"\r\n\r\n"
        for e in events
    )


START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 12, "cache_read_input_tokens": 3, "output_tokens": 1},
    },
}
PING = {"type": "ping"}


def text_block(index: int, *pieces: str) -> list[dict]:
    start = {
        "type": "content_block_start",
        "index": index,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
        for p in pieces
    ]
    return [start, *deltas, {"type": "content_block_stop", "index": index}]


def tool_block(index: int, tool_id: str, name: str, *fragments: str) -> list[dict]:
    block = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
    start = {"type": "content_block_start", "index": index, "content_block": block}
    deltas = [
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": f},
        }
        for f in fragments
    ]
    return [start, *deltas, {"type": "content_block_stop", "index": index}]


def ending(stop_reason: str, output_tokens: int) -> list[dict]:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }
    return [delta, {"type": "message_stop"}]


def translate(
    stream: bytes, include_usage: bool = False, step: int = 7
) -> tuple[list, StreamTranslator]:
    """Feed `stream` in `step`-byte pieces; return the OpenAI events' data and the translator."""
    translator = StreamTranslator(1700000000, include_usage)
    out = b"".join(translator.feed(stream[i : i + step]) for i in range(0, len(stream), step))
    translator.finish()
    assert out.endswith(b"data: [DONE]\n\n")
    events = [line[6:] for line in out.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    return [orjson.loads(e) for e in events[:-1]], translator


def test_text_stream_becomes_role_content_and_finish_chunks():
    stream = sse(START, PING, *text_block(0, "Hel", "lo"), *ending("end_turn", 5))
    chunks, translator = translate(stream)
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert {(c.id, c.model, c.created, c.object) for c in parsed} == {
        ("msg_1", "claude-x", 1700000000, "chat.completion.chunk")
    }
    assert parsed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in parsed) == "Hello"
    assert [c.choices[0].finish_reason for c in parsed] == [None, None, None, "stop"]
    assert (translator.used_tokens, translator.completion_tokens) == (15 + 5, 5)
    assert translator.cached_tokens == 3, "priced at the deployment's cached_input"


def test_usage_chunk_only_when_asked_for():
    stream = sse(START, *text_block(0, "a"), *ending("max_tokens", 1))
    chunks, _ = translate(stream, include_usage=True)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    usage = ChatCompletionChunk.model_validate(chunks[-1])
    assert usage.choices == []
    assert usage.usage is not None
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens) == (15, 1)
    assert usage.usage.total_tokens == 16
    without, _ = translate(stream)
    assert all(c["choices"] for c in without)


def test_tool_use_streams_as_indexed_tool_call_deltas():
    stream = sse(
        START,
        *text_block(0, "Let me check."),
        *tool_block(1, "toolu_a", "weather", "", '{"city":', ' "Oslo"}'),
        *tool_block(2, "toolu_b", "time", "{}"),
        *ending("tool_use", 30),
    )
    chunks, _ = translate(stream, step=3)
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    calls: dict[int, dict[str, str]] = {}
    for chunk in parsed:
        for call in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
    assert calls == {
        0: {"id": "toolu_a", "name": "weather", "arguments": '{"city": "Oslo"}'},
        1: {"id": "toolu_b", "name": "time", "arguments": "{}"},
    }
    first = next(c for c in chunks if "tool_calls" in c["choices"][0]["delta"])
    assert first["choices"][0]["delta"]["tool_calls"][0]["type"] == "function"
    assert parsed[-1].choices[0].finish_reason == "tool_calls"


def test_unknown_events_and_thinking_deltas_are_skipped():
    thinking = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": ""},
    }
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "thinking_delta", "thinking": "hm"},
    }
    stream = sse(START, thinking, delta, {"type": "brand_new_event"}, *ending("end_turn", 2))
    chunks, _ = translate(stream)
    assert len(chunks) == 2


def test_nothing_is_emitted_before_content_so_an_early_error_can_fall_back():
    translator = StreamTranslator(0, False)
    assert translator.feed(sse(START, PING)) == b""
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(StreamBroken):
        translator.feed(sse(error))


def test_an_error_event_breaks_the_stream_as_ended_by_the_upstream():
    translator = StreamTranslator(0, False)
    translator.feed(sse(START, *text_block(0, "par")))
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(StreamBroken, match="overloaded_error") as caught:
        translator.feed(sse(error))
    assert caught.value.upstream_ended


def test_a_stream_without_message_stop_is_broken():
    translator = StreamTranslator(0, False)
    translator.feed(sse(START, *text_block(0, "par"), ending("end_turn", 1)[0]))
    with pytest.raises(StreamBroken, match="message_stop"):
        translator.finish()
    assert translator.used_tokens is None


@pytest.mark.parametrize(
    "data",
    [b"data: {not json\n\n", b'data: {"type":"content_block_delta"}\n\n', sse(*text_block(0, "x"))],
)
def test_unreadable_or_out_of_order_events_are_broken_not_ended(data):
    translator = StreamTranslator(0, False)
    with pytest.raises(StreamBroken) as caught:
        translator.feed(data)
    assert not caught.value.upstream_ended
