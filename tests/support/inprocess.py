"""A gateway running inside the test's event loop, for tests that also call its pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn

from sluicegate.api.server import guarded
from sluicegate.app import Runtime, build
from sluicegate.config.loader import parse_settings
from sluicegate.core.limits import LimitStore
from sluicegate.core.types import Settings
from tests.support.processes import free_port


@dataclass
class InProcessGateway:
    runtime: Runtime
    settings: Settings
    url: str


@asynccontextmanager
async def inprocess_gateway(
    raw: dict, env: dict[str, str], store: LimitStore | None = None
) -> AsyncIterator[InProcessGateway]:
    settings = parse_settings(raw, "test-config", env)
    runtime = build(settings, store=store)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            runtime.app,
            host="127.0.0.1",
            port=port,
            lifespan="on",
            log_level="warning",
            http=guarded(settings.edge),
            access_log=False,
        )
    )
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:  # noqa: ASYNC110 - uvicorn offers a flag, not an event
            await asyncio.sleep(0.01)
    try:
        yield InProcessGateway(runtime, settings, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        await task
