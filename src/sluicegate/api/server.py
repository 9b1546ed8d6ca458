"""Run an ASGI app on uvicorn with the fast loop and parser, the same way for every command."""

from __future__ import annotations

import contextlib
import signal
import socket
from types import FrameType

import uvicorn

from sluicegate.api.asgi import Handler

BACKLOG = 2048


def listen(
    host: str, port: int, *, reuse_port: bool = False, listening: bool = True
) -> socket.socket:
    """Bind before announcing anything, so a taken port fails with one clear line.

    Handing uvicorn a ready socket also keeps it from starting resolver threads,
    which can receive (and lose) the SIGINT meant for the server. With `reuse_port`,
    each of several worker processes binds its own socket on the same port and the
    kernel spreads new connections over them (one shared accept queue hands most of
    them to whichever worker is warm). Bound but not `listening`, a socket holds the
    port for the group without taking connections.
    """
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind((host, port))
        if listening:
            listener.listen(BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener


def serve(
    app: Handler, listener: socket.socket, *, log_level: str = "warning", graceful_s: float = 5.0
) -> None:
    """Serve until SIGINT/SIGTERM; open requests get `graceful_s` to finish, then the
    app's shutdown runs, and this returns.

    uvicorn re-raises the signal it caught once it has shut down. For SIGTERM (the stop
    signal of systemd, Docker and Kubernetes) the default action would end the process
    on the spot, skipping the caller's own clean-up (such as stopping the demo's
    simulator), so it is turned into the same quiet return as SIGINT.
    """
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        backlog=BACKLOG,
        timeout_graceful_shutdown=int(graceful_s),
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            uvicorn.Server(config).run(sockets=[listener])
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
