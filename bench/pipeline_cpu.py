"""CPU per request of the gateway's own code path, without HTTP on either side.

Runs requests through the pipeline of a built runtime (the same gates, dispatcher,
pools and attempt code as HTTP traffic) against a zero-latency provider in this
process, and prints the process CPU time per request: serial, and 16 at once. HTTP
parsing and the upstream client are left out on purpose, so that a change of the
gateway's own code is not lost in the noise of both HTTP legs on a shared machine.

Compare two versions in one sitting by alternating them, e.g. the code at a commit
checked out as a worktree in /tmp/start against the working tree:

    for i in 1 2 3; do
      PYTHONPATH=/tmp/start/src .venv/bin/python bench/pipeline_cpu.py
      .venv/bin/python bench/pipeline_cpu.py
    done

It works with the pipeline entry of before and after `Pipeline.run` existed.
`PIPELINE_CPU_SPEND=1` prices the deployment and gives the tenant a budget (in memory),
for the cost of spend accounting on the request path.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import uvloop

from sluicegate import app
from sluicegate.config.loader import parse_settings
from sluicegate.core.types import Endpoint

REQUESTS = int(os.environ.get("PIPELINE_CPU_REQUESTS", "20000"))
WIDTH = 16
BODY = b'{"choices":[{"message":{"content":"hi"}}],"usage":{"total_tokens":12}}'
CONFIG = {
    "pools": [{"name": "p", "max_concurrency": 64, "tokens_per_minute": 1e12}],
    "models": [
        {
            "name": "chat",
            "deployments": [
                {"name": "d", "base_url": "http://127.0.0.1:9/v1", "model": "m", "pools": ["p"]}
            ],
        }
    ],
    "tenants": [
        {
            "name": "a",
            "keys": [{"env": "A_KEY"}],
            "limits": {"max_concurrency": 64, "requests_per_minute": 1e9},
        }
    ],
}
if os.environ.get("PIPELINE_CPU_SPEND") == "1":
    CONFIG["models"][0]["deployments"][0]["price"] = {"input": 1.0, "output": 2.0}  # type: ignore[index]
    CONFIG["spend"] = {"budgets": [{"tenant": "a", "amount": 1e6}]}
PAYLOAD = {"model": "chat", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 16}


class Reply:
    used_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None

    async def read(self) -> bytes:
        self.used_tokens, self.completion_tokens = 12, 2
        return BODY


class InstantProvider:
    def __init__(self, deployment: Any) -> None:
        self.deployment = deployment

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @asynccontextmanager
    async def open(self, endpoint: Any, payload: Any, budget_s: float) -> AsyncIterator[Reply]:
        yield Reply()


def runtime() -> Any:
    """Built as `serve` builds it, with the provider made by the app swapped for the
    instant one (the one seam both versions share)."""
    settings = parse_settings(CONFIG, "bench", {"A_KEY": "sk-a"})
    app.make_provider = InstantProvider
    return app.build(settings), settings


async def one(rt: Any, settings: Any) -> None:
    pipeline, tenant, now = rt.pipeline, settings.tenants[0], time.monotonic()
    if hasattr(pipeline, "run"):
        from sluicegate.pipeline import Inbound

        async def payload() -> dict[str, Any]:
            return dict(PAYLOAD)

        async with pipeline.run(Inbound(Endpoint.CHAT, tenant, now, payload)) as answer:
            await answer.read()
        return
    async with AsyncExitStack() as permits:
        await pipeline.enter(Endpoint.CHAT, tenant, permits)
        call = pipeline.resolve(tenant, Endpoint.CHAT, dict(PAYLOAD), now, None)
        await pipeline.charge(call, permits)
        async with pipeline.attempt(call) as answer:
            await answer.read()
    # Before `Pipeline.run`, the HTTP edge recorded each outcome; do its part here too.
    metrics, end = pipeline._metrics, time.monotonic()
    metrics.answered("chat", "chat", 200)
    bound = metrics.route("chat", "chat")
    bound.latency.observe(end - now)
    bound.admission.observe(end - now)
    bound.upstream.observe(end - now)


async def measure() -> tuple[float, float]:
    rt, settings = runtime()
    tasks = [asyncio.ensure_future(d.run()) for d in rt.dispatchers.values()]
    for _ in range(500):
        await one(rt, settings)
    began = time.process_time()
    for _ in range(REQUESTS // 4):
        await one(rt, settings)
    serial = (time.process_time() - began) / (REQUESTS // 4)
    began = time.process_time()
    for _ in range(REQUESTS // WIDTH):
        await asyncio.gather(*(one(rt, settings) for _ in range(WIDTH)))
    wide = (time.process_time() - began) / (REQUESTS // WIDTH * WIDTH)
    for task in tasks:
        task.cancel()
    return serial, wide


def main() -> None:
    serial, wide = uvloop.run(measure())
    print(
        f"pipeline CPU per request: serial {serial * 1e6:.1f} us, "
        f"{WIDTH} at once {wide * 1e6:.1f} us"
    )


if __name__ == "__main__":
    main()
