"""Fallback, throttling as a shared signal, circuit breaking and recovery (MISSION 5.4-6.5).

Two simulators: `a` is the one that misbehaves, `b` stays healthy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from tests.e2e.conftest import sim_stats
from tests.support.inprocess import inprocess_gateway
from tests.support.processes import Proc, free_port, start

ENV = {"A_KEY": "sk-a"}
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> Iterator[tuple[Proc, Proc]]:
    logs = tmp_path_factory.mktemp("resilience")
    a = start("sim", ["--max-model-len", "256", "--kv-cache-tokens", "65536"], logs)
    b = start("sim", [], logs)
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture
async def faulty(sims, http):
    """Faults on sim `a`, cleared (and its counters reset) around each test."""

    async def apply(**settings) -> None:
        async with http.post(f"{sims[0].url}/sim/faults", json=settings) as resp:
            assert resp.status == 200

    for sim in sims:
        async with http.post(f"{sim.url}/sim/reset"):
            pass
    yield apply
    async with http.delete(f"{sims[0].url}/sim/faults"):
        pass


def deployment(name: str, url: str, **extra) -> dict:
    return {"name": name, "base_url": f"{url}/v1", "model": "sim-model", **extra}


def config(*deployments: dict, strategy: str = "fallback", **top) -> dict:
    return {
        "models": [{"name": "chat", "strategy": strategy, "deployments": list(deployments)}],
        "tenants": [{"name": "a", "keys": [{"env": "A_KEY"}]}],
        **top,
    }


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-a", max_retries=0)


async def ask(url: str, stream: bool = False, max_tokens: int = 4, content: str = "hello") -> str:
    messages = [{"role": "user", "content": content}]
    reply = await client(url).chat.completions.create(
        model="chat", messages=messages, max_tokens=max_tokens, stream=stream
    )
    if not stream:
        return reply.choices[0].message.content
    return "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refused_connection_falls_back_without_a_visible_error(sims, faulty, stream):
    dead = f"http://127.0.0.1:{free_port()}"
    async with inprocess_gateway(
        config(deployment("a", dead), deployment("b", sims[1].url)), ENV
    ) as gw:
        assert await ask(gw.url, stream)


@pytest.mark.parametrize("stream", [False, True])
async def test_503s_fall_back_without_a_visible_error(sims, faulty, http, stream):
    await faulty(down=True)
    raw = config(deployment("a", sims[0].url), deployment("b", sims[1].url))
    async with inprocess_gateway(raw, ENV) as gw:
        for _ in range(3):
            assert await ask(gw.url, stream)
    assert (await sim_stats(http, sims[0]))["received"] >= 1
    assert (await sim_stats(http, sims[1]))["completed"] == 3


async def test_a_hanging_deployment_times_out_and_falls_back(sims, faulty, http):
    await faulty(hang=True)
    slow = deployment("a", sims[0].url, timeouts={"read_s": 0.3}, cancel_grace_s=0)
    async with inprocess_gateway(config(slow, deployment("b", sims[1].url)), ENV) as gw:
        assert await ask(gw.url)
        assert await ask(gw.url, stream=True)
    for _ in range(50):
        stats = await sim_stats(http, sims[0])
        if stats["cancelled"] >= 2:
            break
        await asyncio.sleep(0.05)
    assert stats["cancelled"] >= 2
    assert stats["running"] == 0


async def test_a_stream_that_already_started_ends_with_an_error_event(sims, faulty, http):
    await faulty(drop_after_tokens=3)
    raw = config(deployment("a", sims[0].url), deployment("b", sims[1].url))
    async with inprocess_gateway(raw, ENV) as gw:
        with pytest.raises(openai.APIError, match="ended the response early"):
            await ask(gw.url, stream=True, max_tokens=20)
    assert (await sim_stats(http, sims[1]))["received"] == 0


async def test_a_context_length_error_moves_to_a_larger_window(sims, faulty, http):
    raw = config(
        deployment("a", sims[0].url, context_window=256),
        deployment("b", sims[1].url, context_window=32768),
    )
    async with inprocess_gateway(raw, ENV) as gw:
        assert await ask(gw.url, content="x" * 2000)
    assert (await sim_stats(http, sims[0]))["received"] == 1
    assert (await sim_stats(http, sims[1]))["completed"] == 1


async def test_a_429_storm_is_one_cooldown_shared_by_all_callers(sims, faulty, http):
    await faulty(throttle_rate=1.0, throttle_retry_after_s=5)
    raw = {
        "models": [
            {"name": "chat", "deployments": [deployment("a", sims[0].url)]},
            {"name": "other", "deployments": [deployment("b", sims[1].url)]},
        ],
        "tenants": [{"name": "a", "keys": [{"env": "A_KEY"}]}],
    }
    async with inprocess_gateway(raw, ENV) as gw:
        headers = {"Authorization": "Bearer sk-a"}
        body = {"model": "chat", "messages": MESSAGES, "max_tokens": 2}
        url = f"{gw.url}/v1/chat/completions"
        async with http.post(url, json=body, headers=headers) as resp:
            first = resp.status, resp.headers.get("retry-after"), (await resp.json())["error"]
        later = []
        for _ in range(10):
            async with http.post(url, json=body, headers=headers) as resp:
                later.append(
                    (
                        resp.status,
                        int(resp.headers["retry-after"]),
                        (await resp.json())["error"]["code"],
                    )
                )
        assert await client(gw.url).chat.completions.create(
            model="other", messages=MESSAGES, max_tokens=2
        )
    assert first[:2] == (503, "5")
    assert first[2]["code"] == "upstream_throttled"
    # Told to come back after the cooldown, spread over the 10 s ramp that follows it.
    assert all(status == 503 and 0 < wait <= 5 + 10 for status, wait, _ in later)
    assert len({wait for _, wait, _ in later}) > 1
    assert {code for *_, code in later} == {"pool_cooling_down"}
    assert (await sim_stats(http, sims[0]))["received"] == 1


async def test_the_circuit_opens_probes_closes_and_dispatch_ramps(sims, faulty, http):
    breaker = {"consecutive_failures": 3, "open_s": 0.5, "ramp_s": 2.0, "ramp_from": 1}
    raw = config(
        deployment("a", sims[0].url, breaker=breaker, pools=["a"]),
        pools=[{"name": "a", "max_concurrency": 16}],
        routes={"chat": {"retry": {"max_attempts": 1}}},
        scheduling={"lanes": [{"name": "default", "queue_size": 100, "max_queue_age_s": 30}]},
    )
    await faulty(error_rate=1.0, error_status=500)
    async with inprocess_gateway(raw, ENV) as gw:
        for _ in range(3):
            with pytest.raises(openai.InternalServerError):
                await ask(gw.url)
        async with http.get(f"{gw.url}/metrics") as resp:
            assert 'sluicegate_circuit{deployment="a",state="open"} 1.0' in await resp.text()
        headers = {"Authorization": "Bearer sk-a", "X-Sluicegate-Timeout": "0.2"}
        body = {"model": "chat", "messages": MESSAGES, "max_tokens": 2}
        async with http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r:
            # Its 0.2 s could not outlast the circuit's 0.5 s: answered at once, retryable,
            # told to come back after the reopening, somewhere in the 2 s ramp after it.
            assert (r.status, (await r.json())["error"]["code"]) == (503, "circuit_open")
            assert 1 <= int(r.headers["retry-after"]) <= 3
        assert (await sim_stats(http, sims[0]))["received"] == 3
        await faulty(error_rate=0.0)
        await asyncio.sleep(0.55)
        assert await ask(gw.url)
        closed_at = asyncio.get_running_loop().time()
        flood = [asyncio.ensure_future(ask(gw.url, max_tokens=40)) for _ in range(60)]
        samples = []
        for _ in range(25):
            await asyncio.sleep(0.1)
            elapsed = asyncio.get_running_loop().time() - closed_at
            samples.append((round(elapsed, 2), (await sim_stats(http, sims[0]))["running"]))
        assert all(await asyncio.gather(*flood))
    # The ramp allows 1 + 15 x elapsed / ramp length (2 s x 0.8..1.2) attempts at once.
    for elapsed, running in samples:
        assert running <= 2 + 15 * elapsed / 1.6, samples
    assert max(running for _, running in samples) >= 12, samples


async def test_a_hedge_wins_and_the_loser_is_cancelled_but_holds_its_permit_until_it_ends(
    sims, faulty, http
):
    await faulty(hang=True)
    raw = config(
        deployment("a", sims[0].url, cancel_grace_s=0.4),
        deployment("b", sims[1].url),
        routes={"chat": {"hedge_after_s": 0.2, "retry": {"max_attempts": 1}}},
    )
    async with inprocess_gateway(raw, ENV) as gw:
        loser_pool = gw.runtime.pools["a"]
        assert await ask(gw.url)
        assert loser_pool.counters.active == 1
        for _ in range(40):
            if (await sim_stats(http, sims[0]))["cancelled"] == 1:
                break
            await asyncio.sleep(0.02)
        assert loser_pool.counters.active == 1
        await asyncio.sleep(0.5)
        assert loser_pool.counters.active == 0
        async with http.get(f"{gw.url}/metrics") as resp:
            metrics = await resp.text()
    assert (await sim_stats(http, sims[0]))["cancelled"] == 1
    assert (await sim_stats(http, sims[1]))["completed"] == 1
    assert 'sluicegate_hedges_total{outcome="sent"} 1.0' in metrics
    assert 'sluicegate_hedges_total{outcome="won"} 1.0' in metrics


async def test_a_first_byte_timeout_moves_a_slow_start_to_the_next_link(sims, faulty, http):
    await faulty(slowdown=50)
    raw = config(
        deployment("a", sims[0].url, timeouts={"first_byte_s": 0.2}, cancel_grace_s=0),
        deployment("b", sims[1].url),
    )
    async with inprocess_gateway(raw, ENV) as gw:
        assert await ask(gw.url, stream=True)
    assert (await sim_stats(http, sims[1]))["completed"] == 1
