"""The Anthropic adapter against a real simulator: its OpenAI-shaped answers match what the
simulator's own OpenAI face says for the same request, and its errors are normalised."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Deployment, Endpoint, Timeouts
from sluicegate.providers.anthropic import AnthropicProvider
from sluicegate.providers.openai import OpenAIProvider
from tests.support.processes import Proc, start

KEY = "anthropic-sim-key"
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    logs = tmp_path_factory.mktemp("anthropic-sim")
    proc = start("sim", ["--api-key", KEY, "--time-scale", "0.1"], logs)
    yield proc
    proc.stop()


def deployment(sim: Proc, provider: str, **changes: Any) -> Deployment:
    base = Deployment(
        name=f"sim-{provider}",
        provider=provider,
        base_url=f"{sim.url}/v1",
        upstream_model="sim-model",
        api_key=KEY,
        timeouts=Timeouts(connect_s=1, read_s=5, total_s=30),
        max_connections=8,
        pools=("sim",),
        cancel_grace_s=0,
    )
    return replace(base, **changes)


@pytest.fixture
async def anthropic(sim: Proc) -> AsyncIterator[AnthropicProvider]:
    provider = AnthropicProvider(deployment(sim, "anthropic"))
    await provider.start()
    yield provider
    await provider.close()


@pytest.fixture
async def openai_face(sim: Proc) -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider(deployment(sim, "openai"))
    await provider.start()
    yield provider
    await provider.close()


def chat(text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {
        "model": "chat",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
        "max_tokens": 6,
        **extra,
    }


async def complete(provider: Any, payload: dict[str, Any]) -> tuple[ChatCompletion, int | None]:
    async with provider.open(Endpoint.CHAT, payload, 30) as upstream:
        body = await upstream.read()
    return ChatCompletion.model_validate_json(body), upstream.used_tokens


async def stream(provider: Any, payload: dict[str, Any]) -> tuple[list[ChatCompletionChunk], Any]:
    async with provider.open(Endpoint.CHAT, {**payload, "stream": True}, 30) as upstream:
        raw = b"".join([chunk async for chunk in upstream.chunks()])
    events = [event.removeprefix(b"data: ") for event in raw.split(b"\n\n") if event]
    assert events[-1] == b"[DONE]"
    return [ChatCompletionChunk.model_validate_json(e) for e in events[:-1]], upstream


def streamed_text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_answer_matches_the_openai_face(anthropic, openai_face) -> None:
    ours, our_tokens = await complete(anthropic, chat())
    theirs, their_tokens = await complete(openai_face, chat())
    assert ours.object == "chat.completion"
    assert ours.model == theirs.model == "sim-model"
    assert ours.choices[0].message.role == "assistant"
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.choices[0].finish_reason == theirs.choices[0].finish_reason == "length"
    assert ours.usage == theirs.usage
    assert our_tokens == their_tokens == theirs.usage.total_tokens


async def test_stream_matches_the_openai_face(anthropic, openai_face) -> None:
    payload = chat(stream_options={"include_usage": True})
    ours, upstream = await stream(anthropic, payload)
    theirs, _ = await stream(openai_face, payload)
    assert ours[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in ours}) == 1
    assert streamed_text(ours) == streamed_text(theirs)
    assert ours[-2].choices[0].finish_reason == theirs[-2].choices[0].finish_reason == "length"
    assert ours[-1].choices == theirs[-1].choices == []
    assert ours[-1].usage == theirs[-1].usage
    assert upstream.used_tokens == ours[-1].usage.total_tokens
    assert upstream.ended


async def test_stream_without_include_usage_still_reports_used_tokens(anthropic) -> None:
    chunks, upstream = await stream(anthropic, chat())
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert upstream.used_tokens == len("Be brief.hello there") // 4 + 6


async def test_tool_calls_arrive_in_openai_shape(anthropic) -> None:
    payload = chat("Please call a tool for Oslo", max_tokens=64, tools=[WEATHER])
    reply, _ = await complete(anthropic, payload)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name) == ("function", "weather")
    assert orjson.loads(call.function.arguments) == {"city": "sim", "days": 1}

    chunks, _ = await stream(anthropic, payload)
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id
    assert deltas[0].function.name == "weather"
    assert {d.index for d in deltas} == {0}
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert orjson.loads(arguments) == {"city": "sim", "days": 1}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_a_conversation_with_tool_results_is_accepted(anthropic) -> None:
    call = {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    payload = chat(tools=[WEATHER], tool_choice="auto")
    payload["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "rain"},
    ]
    reply, _ = await complete(anthropic, payload)
    assert reply.choices[0].message.content


async def test_tool_call_arguments_nested_too_deep_are_a_400_not_a_failure(anthropic) -> None:
    arguments = '{"a": ' * 300 + "1" + "}" * 300
    call = {"id": "t1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    payload = chat()
    payload["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
    ]
    with pytest.raises(GatewayError) as caught:
        await complete(anthropic, payload)
    assert caught.value.status == 400


@pytest.mark.parametrize("endpoint", [Endpoint.COMPLETIONS, Endpoint.EMBEDDINGS])
async def test_other_endpoints_are_refused_before_any_call(anthropic, endpoint) -> None:
    with pytest.raises(GatewayError) as caught:
        async with anthropic.open(endpoint, {"model": "m", "input": "x"}, 30):
            pass
    assert (caught.value.status, caught.value.code) == (400, "unsupported_by_provider")


@pytest.mark.parametrize(
    ("settings", "status", "code"),
    [
        ({"throttle_rate": 1.0, "throttle_retry_after_s": 2}, 503, "upstream_throttled"),
        ({"down": True}, 503, "upstream_unavailable"),
        ({"error_rate": 1.0}, 502, "upstream_error"),
    ],
)
async def test_upstream_faults_are_normalised(anthropic, faults, settings, status, code) -> None:
    await faults(**settings)
    with pytest.raises(GatewayError) as caught:
        await complete(anthropic, chat())
    assert (caught.value.status, caught.value.code) == (status, code)
    if code == "upstream_throttled":
        assert caught.value.retry_after_s == 2


async def test_context_too_long_is_the_openai_code(anthropic) -> None:
    with pytest.raises(GatewayError) as caught:
        await complete(anthropic, chat(max_tokens=40_000))
    assert (caught.value.status, caught.value.code) == (400, "context_length_exceeded")


async def test_a_wrong_key_is_the_gateways_misconfiguration(sim: Proc) -> None:
    provider = AnthropicProvider(deployment(sim, "anthropic", api_key="wrong"))
    await provider.start()
    try:
        with pytest.raises(GatewayError) as caught:
            await complete(provider, chat())
    finally:
        await provider.close()
    assert (caught.value.status, caught.value.code) == (502, "upstream_misconfigured")


async def relay(provider: Any, payload: dict[str, Any], into: list[Any]) -> None:
    """Stream `payload`, keeping the upstream response and then each chunk in `into`."""
    async with provider.open(Endpoint.CHAT, {**payload, "stream": True}, 30) as upstream:
        into.append(upstream)
        async for chunk in upstream.chunks():
            into.append(chunk)


async def test_a_stream_cut_mid_way_is_interrupted(anthropic, faults) -> None:
    await faults(drop_after_tokens=2)
    seen: list[Any] = []
    with pytest.raises(GatewayError) as caught:
        await relay(anthropic, chat(), seen)
    assert (caught.value.status, caught.value.code) == (502, "upstream_interrupted")
    upstream, *chunks = seen
    assert b"".join(chunks).startswith(b"data: {")
    assert upstream.ended
    assert upstream.used_tokens is None
