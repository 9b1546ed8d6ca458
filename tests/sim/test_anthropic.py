"""The Anthropic face (`POST /v1/messages`), driven with raw HTTP against a real process."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tests.sim.conftest import StartSim
from tests.sim.helpers import set_faults, stats, wait_stats
from tests.support.processes import Proc

HEADERS = {"anthropic-version": "2023-06-01"}
WEATHER = {
    "name": "weather",
    "description": "Forecast",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
    },
}


def messages(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


async def post(
    http: aiohttp.ClientSession, sim: Proc, body: dict[str, Any], headers: dict[str, str] = HEADERS
) -> tuple[int, Any, aiohttp.ClientResponse]:
    async with http.post(sim.url + "/v1/messages", json=body, headers=headers) as resp:
        raw = await resp.read()
    return resp.status, raw if body.get("stream") else orjson.loads(raw), resp


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs, checking that each name repeats its data's type."""
    pairs = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        name = name_line.removeprefix("event: ")
        data = orjson.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        pairs.append((name, data))
    return pairs


async def test_message_has_anthropic_shape_and_the_openai_face_text_and_usage(
    sim: Proc, http: aiohttp.ClientSession
) -> None:
    body = messages(system="y" * 11, messages=[{"role": "user", "content": "x" * 30}])
    status, message, _ = await post(http, sim, body)
    assert status == 200
    assert message["id"].startswith("msg_")
    assert (message["type"], message["role"], message["model"]) == (
        "message",
        "assistant",
        "sim-model",
    )
    assert message["stop_reason"] == "max_tokens"
    assert message["stop_sequence"] is None
    assert message["usage"] == {"input_tokens": 11, "output_tokens": 5}
    openai_body = {
        "model": "sim-model",
        "max_tokens": 5,
        "messages": [
            {"role": "system", "content": "y" * 11},
            {"role": "user", "content": "x" * 30},
        ],
    }
    async with http.post(sim.url + "/v1/chat/completions", json=openai_body) as resp:
        completion = await resp.json()
    assert message["content"] == [
        {"type": "text", "text": completion["choices"][0]["message"]["content"]}
    ]
    assert completion["usage"]["prompt_tokens"] == message["usage"]["input_tokens"]
    assert (await stats(http, sim))["completed"] == 2


async def test_stream_follows_anthropic_event_order(sim: Proc, http: aiohttp.ClientSession) -> None:
    status, raw, resp = await post(http, sim, messages(stream=True, max_tokens=4))
    assert status == 200
    assert resp.headers["content-type"] == "text/event-stream"
    pairs = events(raw)
    assert [name for name, _ in pairs] == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = pairs[0][1]["message"]
    assert (start["content"], start["stop_reason"]) == ([], None)
    assert start["usage"]["input_tokens"] == 2
    assert pairs[1][1]["content_block"] == {"type": "text", "text": ""}
    text = "".join(data["delta"]["text"] for name, data in pairs if name == "content_block_delta")
    assert len(text.split()) == 4
    final = pairs[-2][1]
    assert final["delta"]["stop_reason"] == "max_tokens"
    assert final["usage"] == {"output_tokens": 4}


async def test_tool_use_when_asked_to_call_a_tool(sim: Proc, http: aiohttp.ClientSession) -> None:
    body = messages("please call a tool", max_tokens=100, tools=[WEATHER])
    status, message, _ = await post(http, sim, body)
    assert status == 200
    assert message["stop_reason"] == "tool_use"
    [block] = message["content"]
    assert block["type"] == "tool_use"
    assert block["id"].startswith("toolu_")
    assert (block["name"], block["input"]) == (
        "weather",
        {"city": "sim", "days": 1, "unit": "celsius"},
    )
    assert message["usage"]["output_tokens"] < 100

    status, raw, _ = await post(http, sim, {**body, "stream": True})
    pairs = events(raw)
    assert pairs[1][1]["content_block"] == {
        **block,
        "id": pairs[1][1]["content_block"]["id"],
        "input": {},
    }
    fragments = [d["delta"]["partial_json"] for n, d in pairs if n == "content_block_delta"]
    assert len(fragments) > 1
    assert orjson.loads("".join(fragments)) == block["input"]
    assert pairs[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_text_answer_unless_the_tool_is_asked_for_or_forced(
    sim: Proc, http: aiohttp.ClientSession
) -> None:
    _, plain, _ = await post(http, sim, messages("just chat", tools=[WEATHER]))
    assert plain["content"][0]["type"] == "text"
    _, refused, _ = await post(
        http, sim, messages("call a tool", tools=[WEATHER], tool_choice={"type": "none"})
    )
    assert refused["content"][0]["type"] == "text"
    forced = messages("just chat", max_tokens=50, tools=[WEATHER], tool_choice={"type": "any"})
    _, called, _ = await post(http, sim, forced)
    assert called["content"][0]["type"] == "tool_use"


async def test_a_tool_call_cut_by_max_tokens_stops_on_max_tokens(
    sim: Proc, http: aiohttp.ClientSession
) -> None:
    body = messages("call a tool", max_tokens=2, tools=[WEATHER])
    _, message, _ = await post(http, sim, body)
    assert message["stop_reason"] == "max_tokens"
    assert message["usage"]["output_tokens"] == 2


@pytest.mark.parametrize(
    ("faults", "status", "kind"),
    [
        ({"throttle_rate": 1.0, "throttle_retry_after_s": 2.5}, 429, "rate_limit_error"),
        ({"down": True}, 529, "overloaded_error"),
        ({"error_rate": 1.0}, 500, "api_error"),
    ],
)
async def test_faults_answer_with_anthropic_errors(
    sim: Proc, http: aiohttp.ClientSession, faults: dict[str, Any], status: int, kind: str
) -> None:
    await set_faults(http, sim, **faults)
    got, error, resp = await post(http, sim, messages())
    assert (got, error["type"], error["error"]["type"]) == (status, "error", kind)
    assert resp.headers.get("retry-after") == ("3" if status == 429 else None)
    current = await stats(http, sim)
    assert (current["received"], current["failed"], current["started"]) == (1, 1, 0)


@pytest.mark.parametrize(
    ("body", "headers", "status", "kind", "message"),
    [
        (messages(max_tokens=None), HEADERS, 400, "invalid_request_error", "max_tokens"),
        (messages(), {}, 400, "invalid_request_error", "anthropic-version"),
        (messages(model="nope"), HEADERS, 404, "not_found_error", "model: nope"),
        (
            messages("x" * 80_000, max_tokens=1),
            HEADERS,
            400,
            "invalid_request_error",
            "prompt is too long: 20000 tokens > 16384 maximum",
        ),
        (
            messages(max_tokens=16_384),
            HEADERS,
            400,
            "invalid_request_error",
            "input length and `max_tokens` exceed context limit",
        ),
    ],
)
async def test_bad_requests_get_anthropic_errors(
    sim: Proc,
    http: aiohttp.ClientSession,
    body: dict[str, Any],
    headers: dict[str, str],
    status: int,
    kind: str,
    message: str,
) -> None:
    got, error, _ = await post(http, sim, body, headers)
    assert (got, error["error"]["type"]) == (status, kind)
    assert message in error["error"]["message"]


async def test_dropped_stream_never_reaches_message_stop(
    sim: Proc, http: aiohttp.ClientSession
) -> None:
    await set_faults(http, sim, drop_after_tokens=2)
    with pytest.raises(aiohttp.ClientPayloadError):
        await post(http, sim, messages(stream=True))
    assert (await stats(http, sim))["failed"] == 1


async def test_streaming_client_disconnect_cancels_its_sequence(
    sim: Proc, http: aiohttp.ClientSession
) -> None:
    body = messages(stream=True, max_tokens=5000)
    resp = await http.post(sim.url + "/v1/messages", json=body, headers=HEADERS)
    assert (await resp.content.readline()).startswith(b"event: message_start")
    resp.close()
    current = await wait_stats(http, sim, lambda s: s["cancelled"] == 1)
    assert (current["running"], current["completed"]) == (0, 0)


async def test_api_key_is_checked_in_x_api_key(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = start_sim("--api-key", "secret", "--time-scale", "0")
    status, error, _ = await post(
        http, sim, messages(), {**HEADERS, "authorization": "Bearer secret"}
    )
    assert (status, error["error"]["type"]) == (401, "authentication_error")
    status, _, _ = await post(http, sim, messages(), {**HEADERS, "x-api-key": "secret"})
    assert status == 200
