"""Overload answers and the callers who get them (MISSION 11.2): whether clients retry at
once or back off, the backend stays inside its limits; backing off lowers the offered
rate without costing goodput."""

from __future__ import annotations

import asyncio
import random

import aiohttp

from tests.e2e.conftest import SIM_KEY, sim_stats
from tests.support.inprocess import inprocess_gateway

ENV = {"A_KEY": "sk-a", "SIM_KEY": SIM_KEY}
LIMIT = 4
WORKERS = 16
RUN_S = 2.0


def config(sim_url: str) -> dict:
    return {
        "pools": [{"name": "p", "max_concurrency": LIMIT}],
        "models": [
            {
                "name": "chat",
                "deployments": [
                    {
                        "name": "sim",
                        "base_url": f"{sim_url}/v1",
                        "model": "sim-model",
                        "api_key_env": "SIM_KEY",
                        "pools": ["p"],
                    }
                ],
            }
        ],
        "tenants": [{"name": "a", "keys": [{"env": "A_KEY"}]}],
    }


async def offer(url: str, backoff: bool) -> tuple[int, int]:
    """WORKERS closed-loop callers for RUN_S; returns (attempts, successes)."""
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    headers = {"Authorization": "Bearer sk-a"}
    attempts = successes = 0
    rng = random.Random(3)
    loop = asyncio.get_running_loop()
    end = loop.time() + RUN_S

    async def caller(http: aiohttp.ClientSession) -> None:
        nonlocal attempts, successes
        failures = 0
        while loop.time() < end:
            attempts += 1
            async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                await r.read()
                if r.status == 200:
                    successes += 1
                    failures = 0
                    continue
                assert r.status == 503
                failures += 1
                hinted = r.headers.get("retry-after")
            if backoff:
                ceiling = min(1.0, 0.02 * 2**failures)
                await asyncio.sleep(float(hinted) if hinted else rng.uniform(0, ceiling))
            else:
                await asyncio.sleep(0)

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(caller(http) for _ in range(WORKERS)))
    return attempts, successes


async def test_backing_off_lowers_the_offered_rate_and_the_backend_stays_inside_its_limit(
    sim, http
):
    results = {}
    async with inprocess_gateway(config(sim.url), ENV) as gw:
        for backoff in (False, True):
            async with http.post(f"{sim.url}/sim/reset"):
                pass
            attempts, successes = await offer(gw.url, backoff)
            stats = await sim_stats(http, sim)
            results[backoff] = (attempts, successes, stats["max_in_flight"], stats["received"])
    (hammer, hammer_ok, hammer_peak, hammer_seen), (polite, polite_ok, polite_peak, _) = (
        results[False],
        results[True],
    )
    assert hammer_peak <= LIMIT
    assert polite_peak <= LIMIT
    assert hammer_seen == hammer_ok
    assert polite < hammer / 3, results
    assert polite_ok >= 0.8 * hammer_ok, results
