"""Small async helpers for talking to a simulator's control routes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

from tests.support.processes import Proc


async def stats(http: aiohttp.ClientSession, sim: Proc) -> dict[str, int]:
    async with http.get(sim.url + "/sim/stats") as resp:
        return await resp.json()


async def wait_stats(
    http: aiohttp.ClientSession,
    sim: Proc,
    predicate: Callable[[dict[str, int]], bool],
    timeout_s: float = 5.0,
) -> dict[str, int]:
    """Poll /sim/stats until `predicate` holds; fail with the last figures otherwise."""
    current: dict[str, int] = {}
    for _ in range(int(timeout_s / 0.02)):
        current = await stats(http, sim)
        if predicate(current):
            return current
        await asyncio.sleep(0.02)
    raise AssertionError(f"stats never matched: {current}")


async def set_faults(http: aiohttp.ClientSession, sim: Proc, **faults: Any) -> dict[str, Any]:
    async with http.post(sim.url + "/sim/faults", json=faults) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()
