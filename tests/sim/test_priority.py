"""vLLM-style priority scheduling through the HTTP face."""

from __future__ import annotations

import asyncio

import aiohttp
import openai

from tests.sim.conftest import StartSim
from tests.sim.helpers import wait_stats


async def test_lower_priority_value_is_served_first(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = start_sim("--scheduling-policy", "priority", "--max-num-seqs", "1", "--time-scale", "1")
    finished: list[str] = []
    async with openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0) as client:

        async def ask(name: str, priority: int, tokens: int) -> None:
            await client.completions.create(
                model="sim-model", prompt="x", max_tokens=tokens, extra_body={"priority": priority}
            )
            finished.append(name)

        blocker = asyncio.ensure_future(ask("blocker", 0, 100))  # ~0.9 s
        await wait_stats(http, sim, lambda s: s["running"] == 1)
        late = asyncio.ensure_future(ask("low", 10, 2))
        await wait_stats(http, sim, lambda s: s["waiting"] == 1)
        early = asyncio.ensure_future(ask("high", -10, 2))
        await wait_stats(http, sim, lambda s: s["waiting"] == 2)
        await asyncio.wait_for(asyncio.gather(blocker, late, early), 10)
    assert finished == ["blocker", "high", "low"]
