"""`sluicegate serve`: the config read, the sockets bound, the runtime built and served;
with `--workers N`, a supervisor of N worker processes; without `--config`, the demo
and its simulator."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from sluicegate.api.server import CUT_S, SPARE_FILES, fit_open_files, listen, serve
from sluicegate.app import build, counting_workers
from sluicegate.children import spawn, stop
from sluicegate.config import ConfigError, load_settings
from sluicegate.core.types import (
    RedisPolicy,
    Settings,
)
from sluicegate.observability import logs
from sluicegate.observability.siblings import Seat
from sluicegate.stores.redis import inspect
from sluicegate.supervisor import RESTARTS, Supervisor, run_directory

DEMO_KEYS = {"demo-alice": "sk-demo-alice", "demo-bob": "sk-demo-bob"}
DEMO_ADMIN_KEY = "sk-demo-admin"
DEMO_SIM_PORT = "SLUICEGATE_DEMO_SIM_PORT"
"""The variable naming the demo simulator's port (default: a free one), so that a load
can be sent to it directly, bypassing the gateway."""
WORKER_STOP_S = 3.0
"""What a worker may take to shut down after its requests have ended (job workers, the
stores), before the parent kills it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML config; without it, the embedded demo")
    parser.add_argument("--host", help="listen address (overrides server.host)")
    parser.add_argument("--port", type=int, help="listen port (overrides server.port)")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error", "critical"],
        help="the operator log's level (stderr; default info)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes on the port, sharing limits through store: redis (default 1)",
    )
    parser.add_argument("--seat", help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=int, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    with _demo_backend() if args.config is None else _no_backend() as env:
        try:
            settings = load_settings(args.config or _demo_config(), env)
        except ConfigError as exc:
            print(f"sluicegate: {exc}", file=sys.stderr)
            return 2
        settings = dataclasses.replace(
            settings, host=args.host or settings.host, port=args.port or settings.port
        )
        if args.workers < 1:
            print("sluicegate: --workers must be at least 1", file=sys.stderr)
            return 2
        if args.workers > 1 and settings.redis is None:
            print(
                f"sluicegate: --workers {args.workers} needs store: redis; with store: memory "
                "each worker would keep limits of its own and the server would admit "
                f"{args.workers} times every limit",
                file=sys.stderr,
            )
            return 2
        seat = _seat(args.seat)
        worker = "parent" if seat is None and args.workers > 1 else "0"
        logs.configure(args.log_level, worker if seat is None else str(seat.index))
        short = fit_open_files(_files_needed(settings))
        if short is not None and seat is None:
            print(f"sluicegate: {short}", file=sys.stderr)
        listening = seat is not None or args.workers == 1
        listeners = _listeners(_metrics_port(settings, args.metrics_port), args.workers, listening)
        if listeners is None:
            return 1
        settings = _bound(settings, listeners)
        store_down = False
        if settings.redis is not None:
            found = _shared_store_at_start(counting_workers(settings.redis, args.workers))
            if found is None:
                return 1
            store_down = found
        if seat is None and args.workers > 1:
            return _supervise(args, settings, listeners)
        try:
            runtime = build(settings, store_down=store_down, seat=seat)
        except ConfigError as exc:
            print(f"sluicegate: {exc}", file=sys.stderr)
            return 2
        if seat is None:
            demo = env.get("SLUICEGATE_DEMO_SIM_URL") if args.config is None else None
            print(_banner(settings, demo=demo), flush=True)
        serve(
            runtime.app,
            listeners,
            log_level=args.log_level,
            graceful_s=settings.edge.stop_grace_s,
            limits=settings.edge,
            stopping=runtime.gateway,
        )
    return 0


def _metrics_port(settings: Settings, port: int | None) -> Settings:
    """A worker of `--workers N` binds the metrics port its parent chose."""
    listen_apart = settings.metrics.listen
    if port is None or listen_apart is None:
        return settings
    metrics = dataclasses.replace(settings.metrics, listen=(listen_apart[0], port))
    return dataclasses.replace(settings, metrics=metrics)


def _listeners(settings: Settings, workers: int, listening: bool) -> list[socket.socket] | None:
    """The API's socket, then the metrics' when they have an address of their own; None
    when one cannot be bound, said in one line."""
    addresses = [(settings.host, settings.port)]
    if settings.metrics.listen is not None:
        addresses.append(settings.metrics.listen)
    bound = []
    for host, port in addresses:
        try:
            bound.append(listen(host, port, reuse_port=workers > 1, listening=listening))
        except OSError as exc:
            print(f"sluicegate: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
            for sock in bound:
                sock.close()
            return None
    return bound


def _bound(settings: Settings, listeners: list[socket.socket]) -> Settings:
    """`settings` with the ports the listeners hold (a port 0 is chosen when bound)."""
    port = listeners[0].getsockname()[1]
    metrics = settings.metrics
    if metrics.listen is not None:
        metrics = dataclasses.replace(
            metrics, listen=(metrics.listen[0], listeners[1].getsockname()[1])
        )
    return dataclasses.replace(settings, port=port, metrics=metrics)


def _files_needed(settings: Settings) -> int:
    """The files one process may hold: every client connection it admits, every upstream
    connection its deployments allow, and the few of its own."""
    upstream = {d.name: d.max_connections for m in settings.models.values() for d in m.deployments}
    return settings.edge.max_connections + sum(upstream.values()) + SPARE_FILES


def _seat(text: str | None) -> Seat | None:
    """`--seat INDEX/COUNT/DIRECTORY`, given by the supervisor to each worker it starts."""
    if text is None:
        return None
    index, count, directory = text.split("/", 2)
    return Seat(int(index), int(count), Path(directory), int(os.environ.get(RESTARTS, "0")))


def _supervise(args: argparse.Namespace, settings: Settings, holders: list[socket.socket]) -> int:
    """The parent of `--workers N`: `holders` keep the ports while the workers bind them."""
    port = settings.port
    directory = run_directory()
    apart_at = settings.metrics.listen
    metrics_port = [] if apart_at is None else ["--metrics-port", str(apart_at[1])]

    def argv(index: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sluicegate",
            "serve",
            "--config",
            str(args.config),
            "--host",
            settings.host,
            "--port",
            str(port),
            "--log-level",
            args.log_level,
            "--workers",
            str(args.workers),
            "--seat",
            f"{index}/{args.workers}/{directory}",
            *metrics_port,
        ]

    print(f"{_banner(settings, demo=None)}, {args.workers} workers", flush=True)
    try:
        seats = Seat(0, args.workers, directory)
        grace_s = settings.edge.stop_grace_s + CUT_S + WORKER_STOP_S
        return Supervisor(argv, args.workers, directory, grace_s, seats.socket).run()
    finally:
        for holder in holders:
            holder.close()


def _shared_store_at_start(policy: RedisPolicy) -> bool | None:
    """Whether to start degraded (Redis unreachable, `at_start: degraded`), or None when
    the start must stop (`at_start: fail`, or a Redis that cannot hold the fleet's
    limits); says which in one line, after one warning per assumption left unchecked."""
    found = asyncio.run(inspect(policy.url))
    for line in found.unchecked:
        print(f"sluicegate: warning: {line}", file=sys.stderr)
    if found.unfit is not None:
        print(f"sluicegate: {found.unfit}; not starting", file=sys.stderr)
        return None
    problem = found.unreachable
    if problem is None:
        return False
    if policy.at_start == "fail":
        print(f"sluicegate: {problem}; not starting (redis.at_start: fail)", file=sys.stderr)
        return None
    down = policy.when_down
    print(
        f"sluicegate: {problem}; starting degraded (redis.at_start: degraded): concurrency "
        f"{down.concurrency}, rates {down.rates}, as one of {down.expected_replicas} "
        "replicas, until Redis answers",
        file=sys.stderr,
    )
    return True


def _demo_config() -> Path:
    return Path(str(resources.files("sluicegate") / "demo.yaml"))


@contextmanager
def _no_backend() -> Iterator[dict[str, str]]:
    yield dict(os.environ)


@contextmanager
def _demo_backend() -> Iterator[dict[str, str]]:
    """Start `sluicegate sim` as a child process for the demo and stop it afterwards."""
    port = int(os.environ.get(DEMO_SIM_PORT) or _free_port())
    # It serves the demo's model name too, so that a load can skip the gateway.
    served = ["--model", "sim-model", "--model", "demo-chat"]
    where = ["--host", "127.0.0.1", "--port", str(port)]
    child = spawn([sys.executable, "-m", "sluicegate", "sim", *where, *served])
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", child)
        yield {**os.environ, "SLUICEGATE_DEMO_SIM_URL": f"http://127.0.0.1:{port}/v1"}
    finally:
        stop(child, grace_s=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(url: str, child: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(f"sluicegate: the demo simulator exited with {child.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("sluicegate: the demo simulator did not start in time")


def _banner(settings: Settings, *, demo: str | None) -> str:
    """What the server says at start; `demo`: the demo simulator's URL, in the demo."""
    url = f"http://{settings.host}:{settings.port}"
    lines = [f"Sluicegate listening on {url} (models: {', '.join(settings.models)})"]
    if settings.metrics.listen is not None:
        host, port = settings.metrics.listen
        lines.append(f"Metrics on http://{host}:{port}/metrics")
    if demo is not None:
        lines += [
            f"Demo mode: a simulated vLLM backend runs behind the gateway at {demo}.",
            f"Demo keys: {', '.join(f'{k} ({t})' for t, k in DEMO_KEYS.items())}",
            f"Status page: {url}/status (admin key {DEMO_ADMIN_KEY})",
            "A noisy neighbour to watch there: make demo-load (make demo-load-direct: the",
            "  same load straight to the simulator, without the gateway)",
            "Try:",
            f"  curl {url}/v1/chat/completions -H 'Authorization: Bearer sk-demo-alice' \\",
            "    -H 'Content-Type: application/json' \\",
            """    -d '{"model": "demo-chat", "messages": [{"role": "user", "content": "Hi"}],"""
            """ "max_tokens": 16}'""",
        ]
    return "\n".join(lines)
