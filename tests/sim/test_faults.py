"""Injected faults: set at runtime through /sim/faults and seen by a real client."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from sluicegate.sim.faults import FaultInjector, Faults
from tests.sim.helpers import set_faults, stats, wait_stats
from tests.support.processes import Proc

MESSAGES = [{"role": "user", "content": "hello"}]


def test_merge_is_all_or_nothing_and_names_the_bad_field() -> None:
    faults = Faults()
    with pytest.raises(ValueError, match="error_rate"):
        faults.merge({"slowdown": 3, "error_rate": 1.5})
    assert faults == Faults()
    with pytest.raises(ValueError, match="unknown fault 'bogus'"):
        faults.merge({"bogus": 1})
    faults.merge({"slowdown": 3, "drop_after_tokens": 2, "throttle_retry_after_s": 1})
    assert (faults.slowdown, faults.drop_after_tokens, faults.throttle_retry_after_s) == (3, 2, 1)
    faults.reset()
    assert faults == Faults()


def test_fault_draws_repeat_for_the_same_seed() -> None:
    def draws(seed: int) -> list[int | None]:
        injector = FaultInjector(Faults(error_rate=0.3, throttle_rate=0.3), seed)
        return [err.status if (err := injector.refusal()) else None for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert {500, 429, None} == set(draws(7))


async def test_fault_routes_show_merge_and_reset(sim: Proc, http: aiohttp.ClientSession) -> None:
    async with http.get(sim.url + "/sim/faults") as resp:
        assert await resp.json() == {
            "slowdown": 1.0,
            "error_rate": 0.0,
            "error_status": 500,
            "throttle_rate": 0.0,
            "throttle_retry_after_s": None,
            "hang": False,
            "drop_after_tokens": None,
            "down": False,
            "retry_after_header": None,
            "redirect_to": None,
            "body_lie": None,
            "metrics_lie": None,
        }
    await set_faults(http, sim, slowdown=2)
    shown = await set_faults(http, sim, error_status=503)
    assert (shown["slowdown"], shown["error_status"]) == (2.0, 503)
    async with http.post(sim.url + "/sim/faults", json={"error_rate": 2}) as resp:
        assert resp.status == 400
        assert "error_rate" in (await resp.json())["error"]["message"]
    async with http.delete(sim.url + "/sim/faults") as resp:
        assert (await resp.json())["slowdown"] == 1.0


async def test_error_rate_answers_at_once_with_the_configured_status(
    sim: Proc, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    await set_faults(http, sim, error_rate=1.0, error_status=502)
    with pytest.raises(openai.APIStatusError) as excinfo:
        await client.chat.completions.create(model="sim-model", messages=MESSAGES)
    assert excinfo.value.status_code == 502
    assert excinfo.value.code == "injected_error"
    current = await stats(http, sim)
    assert (current["received"], current["failed"], current["started"]) == (1, 1, 0)


@pytest.mark.parametrize("retry_after_s", [2, None])
async def test_throttle_answers_429_with_retry_after_only_when_set(
    sim: Proc, http: aiohttp.ClientSession, retry_after_s: int | None
) -> None:
    await set_faults(http, sim, throttle_rate=1.0, throttle_retry_after_s=retry_after_s)
    body = {"model": "sim-model", "messages": MESSAGES}
    async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 429
        assert resp.headers.get("retry-after") == (None if retry_after_s is None else "2")
        assert (await resp.json())["error"]["type"] == "rate_limit_error"
    assert (await stats(http, sim))["failed"] == 1


async def test_hang_holds_the_sequence_until_the_client_gives_up(
    sim: Proc, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    await set_faults(http, sim, hang=True)
    request = asyncio.ensure_future(
        client.with_options(timeout=0.6).chat.completions.create(
            model="sim-model", messages=MESSAGES, max_tokens=2
        )
    )
    held = await wait_stats(http, sim, lambda s: s["running"] == 1)
    assert (held["started"], held["completed"]) == (1, 0)
    with pytest.raises(openai.APITimeoutError):
        await request
    freed = await wait_stats(http, sim, lambda s: s["cancelled"] == 1)
    assert (freed["running"], freed["completed"]) == (0, 0)


async def test_drop_after_tokens_breaks_streams_and_plain_responses(
    sim: Proc, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    await set_faults(http, sim, drop_after_tokens=3)
    stream = await client.chat.completions.create(
        model="sim-model", messages=MESSAGES, max_tokens=10, stream=True
    )
    chunks: list[ChatCompletionChunk] = []

    async def read_all() -> None:
        async for chunk in stream:
            chunks.append(chunk)

    with pytest.raises(openai.APIConnectionError):
        await read_all()
    assert [chunk.choices[0].finish_reason for chunk in chunks] == [None] * 4
    assert len([chunk for chunk in chunks if chunk.choices[0].delta.content]) == 3
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=10)
    short = await client.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=2)
    assert short.choices[0].finish_reason == "length"
    current = await wait_stats(http, sim, lambda s: s["cancelled"] == 2)
    assert (current["failed"], current["running"], current["completed"]) == (2, 0, 1)
    assert "Traceback" not in sim.output()
    assert "Exception in ASGI application" not in sim.output()


async def test_down_answers_503_everywhere_until_cleared(
    sim: Proc, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    await set_faults(http, sim, down=True)
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 503
        assert "error" in await resp.json()
    with pytest.raises(openai.InternalServerError) as excinfo:
        await client.embeddings.create(model="sim-model", input="x")
    assert excinfo.value.status_code == 503
    assert (await stats(http, sim))["started"] == 0
    await set_faults(http, sim, down=False)
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 200


async def test_slowdown_stretches_every_step(
    sim: Proc, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    await set_faults(http, sim, slowdown=30)
    began = time.monotonic()
    await client.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=5)
    # 5 steps of 0.86 ms (time scale 0.1) times 30; unslowed the request takes ~5 ms.
    assert time.monotonic() - began >= 5 * 0.86e-3 * 30 * 0.95


async def test_lying_faults_answer_as_a_hostile_upstream_would(
    sim: Proc, http: aiohttp.ClientSession
) -> None:
    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    url = sim.url + "/v1/chat/completions"
    await set_faults(http, sim, throttle_rate=1, retry_after_header="inf")
    async with http.post(url, json=chat) as resp:
        assert (resp.status, resp.headers["retry-after"]) == (429, "inf")
    await set_faults(http, sim, throttle_rate=0, redirect_to="http://127.0.0.1:9/x")
    async with http.post(url, json=chat, allow_redirects=False) as resp:
        assert (resp.status, resp.headers["location"]) == (307, "http://127.0.0.1:9/x")
    async with http.get(sim.url + "/metrics", allow_redirects=False) as resp:
        assert resp.status == 307
    await set_faults(http, sim, redirect_to=None, body_lie="invalid_json", metrics_lie="nan")
    async with http.post(url, json=chat) as resp:
        assert resp.status == 200
        with pytest.raises(json.JSONDecodeError, match="char"):
            json.loads(await resp.read())
    async with http.get(sim.url + "/metrics") as resp:
        assert b"num_requests_waiting{" in await resp.read()
    async with http.post(sim.url + "/sim/faults", json={"body_lie": "lies"}) as resp:
        assert resp.status == 400
