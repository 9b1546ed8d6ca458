"""Run an ASGI app on uvicorn with the fast loop and parser, the same way for every command."""

from __future__ import annotations

import contextlib

import uvicorn

from sluicegate.api.asgi import Router


def serve(
    app: Router, host: str, port: int, *, log_level: str = "warning", graceful_s: float = 5.0
) -> None:
    """Serve until SIGINT/SIGTERM; open requests get `graceful_s` to finish.

    uvicorn re-raises the signal it caught once it has shut down; that is the normal
    way to stop, not an error, so it must not print a traceback.
    """
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=int(graceful_s),
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run()
