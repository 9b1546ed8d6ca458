"""The OpenAI adapter relays a stream byte for byte, except the usage event the gateway
asked for on the caller's behalf, which it removes whole, whatever the line endings."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sluicegate.providers.openai import OpenAIResponse

CHUNK = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}'
USAGE = (
    b'data: {"id":"x","choices":[],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}'
)
DONE = b"data: [DONE]"


class Body:
    """The upstream body as the transport hands it over, cut where the test says."""

    def __init__(self, data: bytes, cut: int) -> None:
        self._data = data
        self._cut = cut
        self.ended = False

    async def chunks(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self._data), self._cut):
            yield self._data[i : i + self._cut]


@pytest.mark.parametrize("end", [b"\n", b"\r\n"])
@pytest.mark.parametrize("cut", [5, 64, 10_000])
async def test_the_usage_event_asked_for_by_the_gateway_is_removed_whole(end, cut):
    stream = b"".join(line + end + end for line in (CHUNK, CHUNK, USAGE, DONE))
    response = OpenAIResponse(Body(stream, cut), "d", hide_usage=True)
    relayed = b"".join([chunk async for chunk in response.chunks()])
    assert relayed == b"".join(line + end + end for line in (CHUNK, CHUNK, DONE))
    assert (response.used_tokens, response.completion_tokens) == (8, 3)


async def test_a_stream_the_caller_asked_usage_for_passes_unchanged():
    stream = b"".join(line + b"\r\n\r\n" for line in (CHUNK, USAGE, DONE))
    response = OpenAIResponse(Body(stream, 7), "d", hide_usage=False)
    assert b"".join([chunk async for chunk in response.chunks()]) == stream
    assert (response.used_tokens, response.completion_tokens) == (8, 3)


async def test_only_the_usage_event_leaves_a_block_with_stray_blank_lines():
    stream = b"\n" + CHUNK + b"\n\n\n" + CHUNK + b"\nid: 2\n\n" + USAGE + b"\n\n\n" + DONE + b"\n\n"
    response = OpenAIResponse(Body(stream, 10_000), "d", hide_usage=True)
    relayed = b"".join([chunk async for chunk in response.chunks()])
    assert relayed == stream.replace(USAGE + b"\n\n", b"")
    assert (response.used_tokens, response.completion_tokens) == (8, 3)


async def test_the_cached_prompt_tokens_of_the_usage_are_read():
    usage = (
        b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,'
        b'"total_tokens":8,"prompt_tokens_details":{"cached_tokens":4}}}'
    )
    stream = b"".join(line + b"\n\n" for line in (CHUNK, usage, DONE))
    response = OpenAIResponse(Body(stream, 64), "d", hide_usage=True)
    assert [chunk async for chunk in response.chunks()]
    assert (response.used_tokens, response.completion_tokens, response.cached_tokens) == (8, 3, 4)
