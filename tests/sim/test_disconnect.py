"""A client that goes away frees its sequence at once, streaming or not."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.sim.helpers import wait_stats
from tests.support.processes import Proc


async def test_streaming_client_disconnect_cancels_its_sequence(
    sim: Proc, http: aiohttp.ClientSession
) -> None:
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 5000, "stream": True}
    resp = await http.post(sim.url + "/v1/completions", json=body)
    for _ in range(3):
        assert (await resp.content.readline()).startswith(b"data: ")
        await resp.content.readline()
    resp.close()
    current = await wait_stats(http, sim, lambda s: s["cancelled"] == 1)
    assert (current["running"], current["completed"], current["started"]) == (0, 0, 1)


async def test_non_streaming_client_disconnect_cancels_its_sequence(
    sim: Proc, http: aiohttp.ClientSession
) -> None:
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 5000}
    request = asyncio.ensure_future(http.post(sim.url + "/v1/completions", json=body))
    await wait_stats(http, sim, lambda s: s["running"] == 1)
    request.cancel()
    current = await wait_stats(http, sim, lambda s: s["cancelled"] == 1)
    assert (current["running"], current["completed"]) == (0, 0)
