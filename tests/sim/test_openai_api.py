"""The OpenAI-compatible routes, driven by the official SDK against a real process."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import openai
import orjson
import pytest

from tests.sim.conftest import StartSim
from tests.sim.helpers import stats
from tests.support.processes import Proc


async def test_chat_completion_has_openai_shape_and_counts_tokens(
    sim: Proc, client: openai.AsyncOpenAI
) -> None:
    parts = [{"type": "text", "text": "x" * 30}, {"type": "image_url", "image_url": {"url": "u"}}]
    response = await client.chat.completions.create(
        model="sim-model",
        messages=[
            {"role": "system", "content": "y" * 11},
            {"role": "user", "content": parts},  # type: ignore[list-item]
        ],
        max_tokens=6,
    )
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert isinstance(response.created, int)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 6
    assert choice.finish_reason == "length"
    assert response.usage is not None
    assert response.usage.prompt_tokens == math.ceil(41 / 4)
    assert response.usage.completion_tokens == 6
    assert response.usage.total_tokens == 6 + 11


async def test_max_completion_tokens_and_the_default_length(client: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    explicit = await client.chat.completions.create(
        model="sim-model", messages=messages, max_completion_tokens=3
    )
    default = await client.chat.completions.create(model="sim-model", messages=messages)
    assert explicit.usage is not None
    assert explicit.usage.completion_tokens == 3
    assert default.usage is not None
    assert default.usage.completion_tokens == 8


async def test_streamed_chat_has_role_tokens_finish_usage_and_done(
    sim: Proc, client: openai.AsyncOpenAI
) -> None:
    stream = await client.chat.completions.create(
        model="other-model",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    tokens = [chunk.choices[0].delta.content for chunk in chunks[1:-2]]
    assert len(tokens) == 5
    assert all(token.startswith(" ") for token in tokens)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 5)
    assert chunks[-1].model == "other-model"


async def test_stream_without_include_usage_ends_with_the_finish_chunk(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert len(chunks) == 4
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(chunk.usage is None for chunk in chunks)


async def test_raw_stream_ends_with_done_sentinel(sim: Proc, http: aiohttp.ClientSession) -> None:
    body = {"model": "sim-model", "prompt": "hi", "max_tokens": 3, "stream": True}
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        assert resp.headers["content-type"] == "text/event-stream"
        raw = await resp.read()
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert all(event.startswith(b"data: {") for event in events[:-2])


async def test_text_completions_plain_and_streamed(client: openai.AsyncOpenAI) -> None:
    response = await client.completions.create(
        model="sim-model", prompt=["abcd", "efgh"], max_tokens=4
    )
    assert response.object == "text_completion"
    assert response.id.startswith("cmpl-")
    assert len(response.choices[0].text.split()) == 4
    assert response.usage is not None
    assert response.usage.prompt_tokens == 2
    stream = await client.completions.create(
        model="sim-model",
        prompt="abcd",
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    streamed = "".join(chunk.choices[0].text for chunk in chunks[:3])
    assert response.choices[0].text.startswith(streamed)
    assert len(streamed.split()) == 3
    assert chunks[3].choices[0].finish_reason == "length"
    assert chunks[4].usage is not None
    assert chunks[4].usage.completion_tokens == 3


async def test_embeddings_are_deterministic_in_both_encodings(
    sim: Proc, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    first = await client.embeddings.create(model="sim-model", input=["alpha", "beta"])
    again = await client.embeddings.create(
        model="sim-model", input="alpha", encoding_format="float"
    )
    assert [item.index for item in first.data] == [0, 1]
    assert len(first.data[0].embedding) == 16
    assert first.data[0].embedding == pytest.approx(again.data[0].embedding, abs=1e-6)
    assert first.data[0].embedding != first.data[1].embedding
    assert first.usage.prompt_tokens == math.ceil(len("alphabeta") / 4)
    assert (await stats(http, sim))["completed"] == 2


async def test_models_lists_every_served_name(client: openai.AsyncOpenAI) -> None:
    models = [model.id async for model in client.models.list()]
    assert models == ["sim-model", "other-model"]


async def test_unknown_model_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as excinfo:
        await client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}]
        )
    assert excinfo.value.code == "model_not_found"


async def test_context_length_exceeded_is_400(sim: Proc, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as excinfo:
        await client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "x" * 4000}], max_tokens=16000
        )
    assert excinfo.value.code == "context_length_exceeded"
    assert "maximum context length is 16384 tokens" in excinfo.value.message


async def test_priority_is_refused_under_fcfs(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as excinfo:
        await client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "x"}],
            extra_body={"priority": 3},
        )
    assert excinfo.value.code == "invalid_priority"


CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b"[1, 2]"),
        ("/v1/chat/completions", {"model": "sim-model"}),
        ("/v1/chat/completions", {"model": "sim-model", "messages": [{"content": "x"}]}),
        ("/v1/chat/completions", {**CHAT, "model": 3}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "9"}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 0}),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}),
        ("/v1/chat/completions", {**CHAT, "stream": 1}),
        ("/v1/chat/completions", {**CHAT, "n": 2}),
        ("/v1/completions", {"model": "sim-model", "prompt": [1, 2]}),
        ("/v1/embeddings", {"model": "sim-model", "input": []}),
        ("/v1/embeddings", {"model": "sim-model", "input": "x", "encoding_format": "hex"}),
    ],
)
async def test_malformed_requests_get_openai_shaped_400(
    sim: Proc, http: aiohttp.ClientSession, path: str, body: bytes | dict[str, object]
) -> None:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(sim.url + path, data=data) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    current = await stats(http, sim)
    assert (current["received"], current["started"]) == (1, 0)
    assert "Traceback" not in sim.output()


async def _usage_event(http: aiohttp.ClientSession, url: str, max_tokens: int) -> dict[str, object]:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "x" * 400}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        events = (await resp.read()).split(b"\n\n")
    usage_events = [
        orjson.loads(e[6:]) for e in events if e.startswith(b"data: {") and b'"usage"' in e
    ]
    assert len(usage_events) == 1
    return usage_events[0]


async def test_usage_event_tells_the_engine_queue_wait_and_prefill(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    """One sequence at a time: the second request waits in the engine for the first."""
    sim = start_sim("--max-num-seqs", "1")
    first, second = await asyncio.gather(
        _usage_event(http, sim.url, 30), _usage_event(http, sim.url, 30)
    )
    timings = sorted(
        (event["sim_timing"] for event in (first, second)), key=lambda t: t["waiting_s"]
    )
    assert timings[0]["waiting_s"] < 0.05
    # 30 steps of at least 8 ms each ran before the second was taken into the batch.
    assert timings[1]["waiting_s"] >= 0.2
    for timing in timings:
        assert 0 < timing["prefill_s"] < 0.2
