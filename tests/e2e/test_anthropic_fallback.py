"""An OpenAI-SDK client served through the gateway by an Anthropic-shaped deployment, as the
fallback of an OpenAI one: the answer's shape is the one the OpenAI link gives."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import orjson
import pytest

from tests.support.inprocess import inprocess_gateway
from tests.support.processes import Proc, free_port, start

ENV = {"A_KEY": "sk-a"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start("sim", ["--time-scale", "0.1"], tmp_path_factory.mktemp("anthropic-fallback"))
    yield proc
    proc.stop()


def config(*deployments: dict) -> dict:
    return {
        "models": [{"name": "chat", "strategy": "fallback", "deployments": list(deployments)}],
        "tenants": [{"name": "a", "keys": [{"env": "A_KEY"}]}],
    }


def deployment(name: str, url: str, provider: str) -> dict:
    return {"name": name, "provider": provider, "base_url": f"{url}/v1", "model": "sim-model"}


@pytest.fixture
async def gateways(backend: Proc):
    """A dead OpenAI link falling back to the Anthropic face, and the OpenAI face alone."""
    dead = f"http://127.0.0.1:{free_port()}"
    chain = config(deployment("a", dead, "openai"), deployment("b", backend.url, "anthropic"))
    direct = config(deployment("o", backend.url, "openai"))
    async with inprocess_gateway(chain, ENV) as fallback, inprocess_gateway(direct, ENV) as plain:
        yield (
            openai.AsyncOpenAI(base_url=f"{fallback.url}/v1", api_key="sk-a", max_retries=0),
            openai.AsyncOpenAI(base_url=f"{plain.url}/v1", api_key="sk-a", max_retries=0),
        )


async def test_fallback_to_anthropic_has_the_openai_shape(gateways) -> None:
    via_anthropic, via_openai = gateways
    request = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    ours = await via_anthropic.chat.completions.create(**request)
    theirs = await via_openai.chat.completions.create(**request)
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.choices[0].finish_reason == theirs.choices[0].finish_reason
    assert ours.usage == theirs.usage

    options = {"stream": True, "stream_options": {"include_usage": True}}
    ours_stream = [
        c async for c in await via_anthropic.chat.completions.create(**request, **options)
    ]
    theirs_stream = [
        c async for c in await via_openai.chat.completions.create(**request, **options)
    ]
    text = [
        "".join(c.choices[0].delta.content or "" for c in s if c.choices)
        for s in (ours_stream, theirs_stream)
    ]
    assert text[0] == text[1]
    assert ours_stream[-1].usage == theirs_stream[-1].usage


async def test_fallback_to_anthropic_returns_tool_calls(gateways) -> None:
    via_anthropic, _ = gateways
    reply = await via_anthropic.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "call a tool"}],
        tools=[WEATHER],
        max_tokens=50,
    )
    [call] = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert orjson.loads(call.function.arguments) == {"city": "sim"}
    stream = await via_anthropic.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "call a tool"}],
        tools=[WEATHER],
        max_tokens=50,
        stream=True,
    )
    chunks = [c async for c in stream]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert orjson.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "sim"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
