"""Client-observed latency of a request the gateway refuses at its first check.

Sends one request with a key no tenant has (401, answered before the body is read)
every INTERVAL seconds from its own lightly loaded process, so the figure is the
gateway's and the machine's responsiveness, not a busy load generator's:

    .venv/bin/python bench/refusal_probe.py http://127.0.0.1:PORT 40

Run it beside a `sluicegate bench run` (the gateway's port is in `ps`) or against an
idle gateway. Loopback only.
"""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp
import uvloop

INTERVAL_S = 0.02


async def probe(base_url: str, seconds: float) -> list[float]:
    latencies_ms: list[float] = []
    headers = {"authorization": "Bearer not-a-key", "content-type": "application/json"}
    url = f"{base_url}/v1/chat/completions"
    async with aiohttp.ClientSession() as session:
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            started = time.perf_counter()
            async with session.post(url, data=b"{}", headers=headers) as response:
                await response.read()
            latencies_ms.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(INTERVAL_S)
    return sorted(latencies_ms)


def main() -> None:
    url, seconds = sys.argv[1].rstrip("/"), float(sys.argv[2])
    found = uvloop.run(probe(url, seconds))
    n = len(found)
    print(
        f"n={n} p50={found[n // 2]:.2f} p95={found[int(0.95 * n)]:.2f} "
        f"p99={found[int(0.99 * n)]:.2f} max={found[-1]:.2f} ms"
    )


if __name__ == "__main__":
    main()
