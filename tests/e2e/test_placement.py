"""Where requests go, for real: `prefix_affinity` over two prefix-caching simulators sends
every turn of a conversation where its first went, spreads conversations over both, and
the backends' own prefix-cache counters show the hits it aimed for."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import SIM_KEY
from tests.support.processes import Proc, start

KEY = "sk-placement"
SYSTEM = "You answer questions about the weather on the coast, briefly and kindly. " * 8


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[list[Proc]]:
    procs = [
        start("sim", ["--model", "sim-model", "--api-key", SIM_KEY, "--prefix-caching"], tmp_path)
        for _ in range(2)
    ]
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture
def gateway(sims: list[Proc], tmp_path: Path) -> Iterator[Proc]:
    config = {
        "models": [
            {
                "name": "chat",
                "strategy": "prefix_affinity",
                "prefix_affinity": {"block_bytes": 64},
                "deployments": [
                    {
                        "name": f"sim-{i}",
                        "base_url": f"{sim.url}/v1",
                        "model": "sim-model",
                        "api_key_env": "SIM_KEY",
                        "metrics": {"interval_s": 0.1, "stale_after_s": 5},
                    }
                    for i, sim in enumerate(sims)
                ],
            }
        ],
        "tenants": [{"name": "t", "keys": [{"env": "PLACEMENT_KEY"}]}],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"SIM_KEY": SIM_KEY, "PLACEMENT_KEY": KEY}
    proc = start("serve", ["--config", str(path)], tmp_path, env=env, ready_path="/ready")
    yield proc
    proc.stop()


async def samples(http: aiohttp.ClientSession, url: str) -> list:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


async def test_a_conversation_stays_where_it_began_and_conversations_spread(gateway, sims):
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0)
    conversations, turns = 8, 4
    for n in range(conversations):
        messages = [{"role": "system", "content": SYSTEM}]
        for turn in range(turns):
            messages.append({"role": "user", "content": f"conversation {n}, question {turn}?"})
            answer = await client.chat.completions.create(
                model="chat", messages=messages, max_tokens=8
            )
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    async with aiohttp.ClientSession() as http:
        gateway_samples = await samples(http, gateway.url)
        backends = [await samples(http, sim.url) for sim in sims]
    placed = {
        (s.labels["deployment"], s.labels["reason"]): s.value
        for s in gateway_samples
        if s.name == "sluicegate_placements_total"
    }
    by_reason: dict[str, float] = {}
    for (_, reason), count in placed.items():
        by_reason[reason] = by_reason.get(reason, 0) + count
    assert by_reason == {"hash": conversations, "affinity": conversations * (turns - 1)}
    per_deployment = {d: 0.0 for d in ("sim-0", "sim-1")}
    for (deployment, _), count in placed.items():
        per_deployment[deployment] += count
    assert min(per_deployment.values()) >= turns, per_deployment
    hits = [
        sum(s.value for s in backend if s.name == "vllm:prefix_cache_hits_total")
        for backend in backends
    ]
    assert all(hit > 0 for hit in hits), hits
    for _ in range(50):
        async with aiohttp.ClientSession() as http:
            reported = {
                s.labels["deployment"]: s.value
                for s in await samples(http, gateway.url)
                if s.name == "sluicegate_backend_prefix_hit_ratio"
            }
        if len(reported) == 2:
            break
        await asyncio.sleep(0.1)
    assert set(reported) == {"sim-0", "sim-1"}
    assert all(0 < ratio <= 1 for ratio in reported.values()), reported
