"""Simulator faults surface as clean OpenAI-shaped errors, and cancels reach the simulator."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
import yaml

from tests.e2e.conftest import ALICE, gateway_config, sim_stats
from tests.support.processes import free_port, start

MESSAGES = [{"role": "user", "content": "hello"}]


async def test_upstream_500_is_a_clean_502(alice, faults):
    await faults(error_rate=1.0, error_status=500)
    with pytest.raises(openai.InternalServerError) as info:
        await alice.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=2)
    assert info.value.status_code == 502
    assert info.value.code == "upstream_error"


async def test_upstream_down_is_503(alice, faults):
    await faults(down=True)
    with pytest.raises(openai.InternalServerError) as info:
        await alice.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=2)
    assert info.value.status_code == 503
    assert info.value.code == "upstream_unavailable"


async def test_hanging_upstream_times_out_and_is_cancelled(alice, faults, http, sim):
    before = await sim_stats(http, sim)
    await faults(hang=True)
    with pytest.raises(openai.APIStatusError) as info:
        await alice.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=2)
    assert info.value.status_code == 504
    assert info.value.code == "upstream_timeout"
    await wait_for_stats(
        http, sim, lambda s: s["cancelled"] > before["cancelled"] and s["running"] == 0
    )


async def test_stream_cut_mid_way_ends_with_an_error_event(alice, faults):
    await faults(drop_after_tokens=3)
    stream = await alice.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=50, stream=True
    )
    received: list[str] = []
    with pytest.raises(openai.APIError, match="ended the response early"):
        await collect(stream, received)
    assert 0 < len(received) <= 3


async def collect(stream, into: list[str]) -> None:
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            into.append(chunk.choices[0].delta.content)


async def test_unreachable_upstream_is_a_clean_502(tmp_path):
    config = tmp_path / "dead.yaml"
    config.write_text(yaml.safe_dump(gateway_config(f"http://127.0.0.1:{free_port()}")))
    env = {"SIM_KEY": "x", "BAD_KEY": "y", "ALICE_KEY": ALICE}
    proc = start("serve", ["--config", str(config)], tmp_path, env=env, ready_path="/ready")
    try:
        client = openai.AsyncOpenAI(base_url=f"{proc.url}/v1", api_key=ALICE, max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert info.value.code == "upstream_unreachable"
    finally:
        proc.stop()
    assert "Traceback" not in proc.output()


async def wait_for_stats(http, sim, predicate, timeout_s: float = 5.0) -> dict:
    async with asyncio.timeout(timeout_s):
        while True:
            stats = await sim_stats(http, sim)
            if predicate(stats):
                return stats
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_cancels_the_upstream(gateway, sim, http, faults, stream):
    await faults(slowdown=25)
    before = await sim_stats(http, sim)
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 500, "stream": stream}
    headers = {"Authorization": f"Bearer {ALICE}"}
    async with aiohttp.ClientSession() as client:
        request = client.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers)
        if stream:
            async with request as resp:
                assert resp.status == 200
                await resp.content.readany()
        else:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5), request:
                    pass
    stats = await wait_for_stats(
        http, sim, lambda s: s["cancelled"] > before["cancelled"] and s["running"] == 0
    )
    assert stats["completed"] == before["completed"]
