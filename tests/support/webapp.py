"""A small aiohttp app served on a free loopback port: a test's own peer (a classifier,
a moderation endpoint) speaking real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` listening on 127.0.0.1; yields its base URL and stops it on exit."""
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
