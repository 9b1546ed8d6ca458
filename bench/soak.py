"""Soak: mixed traffic with hostile clients on every route and Redis paused every few
minutes, sampling the gateway's RSS and open file descriptors over time.

Starts `redis-server`, a simulator and a gateway (`serve --workers 2`, store: redis, a
SQLite job store), all on loopback, then for DURATION seconds runs:
- ordinary clients: chat (streamed and not, through the OpenAI and the Anthropic
  adapter), completions and embeddings, closed loop;
- cancelled requests: streams abandoned after a random delay;
- never-reading streams: raw sockets with a 4 KiB receive window that never read;
- trickled bodies: a byte of body per second;
- idle connections: opened and left silent;
- hostile requests (`bench/hostile.py`) on every route: chat, the Anthropic adapter,
  completions, embeddings, jobs, files, batches and admin, each judged as it comes back;
- a Redis pause (SIGSTOP, then SIGCONT) of PAUSE_S every PAUSE_EVERY_S (a third of a
  shorter run).
Every SAMPLE_S it records the RSS and open fds of the gateway's processes. Writes
soak.csv and soak.svg to OUT and prints each verdict:
- plateau: growth over the second half below 5 % of the value at its midpoint;
- RSS growth from minute 5 (a quarter of a shorter run) to the end below 10 %;
- open fds back to their count before the clients started, once they have stopped;
- the job store within its quota: each tenant's counted bytes are the bytes it stores,
  and what it submitted (files, job bodies) fits `tenant_storage_max_bytes`;
- no replica degraded RECOVERY_S after Redis answers again, after every pause;
- no hostile request answered with a 5xx other than a deliberate refusal, or out of
  OpenAI's error shape, or left without an answer for HOSTILE_WAIT_S (but a model's
  generation); no pool attempt active afterwards; no traceback in any log.

    flock /tmp/sluicegate-bench.lock .venv/bin/python -m bench.soak 1200 bench/results/soak
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import random
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yaml

from bench.hostile import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    ROUTES,
    Draws,
    Ids,
    Keys,
    Models,
    code_of,
    judge,
    send,
)
from sluicegate import children

SAMPLE_S = 1.0
KEY = "sk-soak"
KEYS = Keys(tenant="sk-hostile", other="sk-narrow", admin="sk-soak-admin")
ENV = {"SOAK_KEY": KEY, "HOSTILE_KEY": KEYS.tenant, "NARROW_KEY": KEYS.other}
ENV |= {"ADMIN_KEY": KEYS.admin}
HOSTILE = {"never_reading": 6, "trickled": 6, "idle": 20, "cancelled": 4}
ORDINARY = 8
WORKERS = 2
HOSTILE_GAP_S = 0.1
"""Each route's hostile client waits this long between calls: about 10 a second per
route, enough to reach every path without drowning the ordinary traffic."""
HOSTILE_WAIT_S = 30.0
"""A hostile client gives up on an answer after this long: past it, a model's answer is
abandoned (as a cancelled request is), and anything else is a fault."""
INFERENCE = frozenset({CHAT, COMPLETIONS, EMBEDDINGS})
MAX_BODY, MAX_FILE = 256 * 1024, 1024 * 1024
QUOTA_BYTES = 1024 * 1024
"""Small enough that the hostile tenant meets it within a minute or two, retention
freeing it."""
PAUSE_S, PAUSE_EVERY_S = 5.0, 180.0
RECOVERY_S = 5.0
"""The longest a replica may stay degraded once Redis answers again (issue 54)."""
WARM_S = 300.0
"""RSS growth is measured from minute 5: the first minutes fill caches and pools."""
SETTLE_S = 30.0
"""How long the open fds may take to come back once the clients have stopped and the jobs
they left have run."""
DRAIN_S = 330.0
"""Longer than the jobs' deadline (`default_deadline_s`): by then every job has ended."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return children.spawn(
        args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )


def sluicegate(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return launch([sys.executable, "-m", "sluicegate", *args], log, env)


def wait_ready(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer")


def redis_answers(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def gateway_config(sim_url: str, redis_port: int, jobs_db: Path) -> dict:
    def model(name: str, provider: str = "openai", upstream: str | None = None) -> dict:
        deployment = {
            "name": f"sim-{name}",
            "provider": provider,
            "base_url": f"{sim_url}/v1",
            "model": upstream or name,
            "pools": ["sim"],
        }
        return {"name": name, "deployments": [deployment]}

    return {
        "server": {
            "header_timeout_s": 5,
            "body_timeout_s": 5,
            "write_timeout_s": 5,
            "max_body_bytes": MAX_BODY,
        },
        "pools": [{"name": "sim", "max_concurrency": 32}],
        "models": [model("chat"), model("embed"), model("claude", "anthropic", "chat")],
        "routes": {"chat": {"max_output_tokens": 64}},
        "tenants": [
            {"name": "soak", "keys": [{"env": "SOAK_KEY"}], "limits": {"max_concurrency": 64}},
            {
                "name": "hostile",
                "keys": [{"env": "HOSTILE_KEY"}],
                "limits": {"max_concurrency": 16},
            },
            {"name": "narrow", "keys": [{"env": "NARROW_KEY"}], "models": ["chat"]},
        ],
        "admin": {"keys": [{"env": "ADMIN_KEY"}]},
        "store": "redis",
        "redis": {"url": f"redis://127.0.0.1:{redis_port}"},
        "jobs": {
            "sqlite_path": str(jobs_db),
            "workers": 4,
            "default_deadline_s": 300,
            "retention_s": 120,
            "retention_sweep_s": 10,
            "max_file_bytes": MAX_FILE,
            "tenant_storage_max_bytes": QUOTA_BYTES,
            "tenant_submissions_per_minute": 1200,
        },
    }


class Traffic:
    def __init__(self, base: str, port: int) -> None:
        self.base, self.port = base, port
        self.headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
        self.counts: Counter[str] = Counter()

    def count(self, what: str) -> None:
        self.counts[what] += 1

    async def ordinary(self, session: aiohttp.ClientSession, stop: float) -> None:
        rng = random.Random()
        while time.monotonic() < stop:
            kind = rng.choice(["chat", "chat_stream", "anthropic", "completions", "embeddings"])
            path, body = {
                "chat": ("/v1/chat/completions", {"model": "chat", "messages": MESSAGES}),
                "chat_stream": (
                    "/v1/chat/completions",
                    {"model": "chat", "messages": MESSAGES, "stream": True},
                ),
                "anthropic": (
                    "/v1/chat/completions",
                    {"model": "claude", "messages": MESSAGES, "stream": rng.random() < 0.5},
                ),
                "completions": ("/v1/completions", {"model": "chat", "prompt": "soak " * 50}),
                "embeddings": ("/v1/embeddings", {"model": "embed", "input": "soak " * 50}),
            }[kind]
            body = {**body, "max_tokens": rng.randint(4, 64)} if kind != "embeddings" else body
            try:
                async with session.post(self.base + path, json=body, headers=self.headers) as r:
                    await r.read()
                    self.count(f"{kind} {r.status}")
            except aiohttp.ClientError as exc:
                self.count(f"{kind} {type(exc).__name__}")

    async def cancelled(self, session: aiohttp.ClientSession, stop: float) -> None:
        rng = random.Random()
        body = {"model": "chat", "messages": MESSAGES, "stream": True, "max_tokens": 64}
        while time.monotonic() < stop:
            call = session.post(self.base + "/v1/chat/completions", json=body, headers=self.headers)
            task = asyncio.ensure_future(_read(call))
            await asyncio.sleep(rng.uniform(0.01, 0.5))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.count("cancelled")

    async def _raw(self, receive_buffer: int | None = None) -> socket.socket:
        sock = socket.socket()
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        return sock

    def _request(self, body: dict, length: int | None = None) -> bytes:
        raw = orjson.dumps(body)
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\n"
            f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
            f"content-length: {length or len(raw)}\r\n\r\n"
        )
        return head.encode() + raw

    async def never_reading(self, stop: float) -> None:
        """A long stream into a 4 KiB window, never read, until the gateway aborts it."""
        loop = asyncio.get_running_loop()
        body = {"model": "chat", "messages": MESSAGES, "stream": True, "max_tokens": 4000}
        while time.monotonic() < stop:
            sock = await self._raw(receive_buffer=4096)
            await loop.sock_sendall(sock, self._request(body))
            await _until_closed(sock, stop, read=False)
            self.count("never_reading")

    async def trickled(self, stop: float) -> None:
        """Headers, then a byte of body a second, until the gateway gives up on it."""
        loop = asyncio.get_running_loop()
        raw = self._request({"model": "chat", "messages": MESSAGES})
        split = raw.index(b"\r\n\r\n") + 4
        while time.monotonic() < stop:
            sock = await self._raw()
            try:
                await loop.sock_sendall(sock, raw[:split])
                for byte in raw[split:]:
                    await loop.sock_sendall(sock, bytes([byte]))
                    await asyncio.sleep(1)
                    if time.monotonic() > stop:
                        break
            except OSError:
                pass
            sock.close()
            self.count("trickled")

    async def idle(self, stop: float) -> None:
        """A connection that sends nothing, until the gateway closes it."""
        while time.monotonic() < stop:
            sock = await self._raw()
            await _until_closed(sock, stop, read=True)
            self.count("idle")


MESSAGES = [{"role": "user", "content": "soak " * 40}]


async def _read(call: Any) -> None:
    async with call as response:
        async for _ in response.content.iter_any():
            pass


async def _until_closed(sock: socket.socket, stop: float, read: bool) -> None:
    """Wait until the peer closed `sock` (reading only if `read`) or the run ends."""
    loop = asyncio.get_running_loop()
    try:
        while time.monotonic() < stop:
            if read:
                if not await asyncio.wait_for(loop.sock_recv(sock, 4096), stop - time.monotonic()):
                    break
            else:
                await asyncio.sleep(0.5)
                info = sock.getsockopt(socket.SOL_TCP, socket.TCP_INFO, 1)
                if info[0] != 1:  # tcpi_state: 1 is ESTABLISHED
                    break
    except (OSError, TimeoutError):
        pass
    finally:
        sock.close()


@dataclass
class Hostile:
    """Hostile calls per route, their answers tallied and every wrong one kept."""

    base: str
    draws: Draws
    ids: Ids = field(default_factory=Ids)
    tally: dict[str, Counter[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    async def route(self, session: aiohttp.ClientSession, route: str, stop: float) -> None:
        tally = self.tally.setdefault(route, Counter())
        for call in self.draws.calls(route):
            await asyncio.sleep(HOSTILE_GAP_S)
            if time.monotonic() >= stop:
                return
            try:
                async with asyncio.timeout(HOSTILE_WAIT_S):
                    status, kind, payload = await send(session, self.base, call, self.ids)
            except aiohttp.ClientError as exc:
                tally[type(exc).__name__] += 1
                if not call.oversized:
                    self.problems.append(f"{route} {call.method} {call.path}: {exc!r}")
                continue
            except TimeoutError:
                # A generation the call left unbounded (no max_tokens) may run this long.
                tally["abandoned"] += 1
                if call.path not in INFERENCE:
                    self.problems.append(f"{route} {call.method} {call.path}: no answer in time")
                continue
            tally[f"{status // 100}xx"] += 1
            if status >= 500 or status == 429:  # refusals for a quota, a rate or capacity
                tally[f"{status} {code_of(payload)}"] += 1
            wrong = judge(status, kind, payload)
            if wrong is not None:
                self.problems.append(f"{route} {call.method} {call.path}: {wrong}")


@dataclass(frozen=True)
class Pause:
    at_s: float
    degraded: bool
    """Whether any replica went degraded while Redis was stopped."""
    recovered_s: float | None
    """From Redis answering again to every replica shared (None: not within SETTLE_S)."""


class RedisPauses:
    """Stops Redis for PAUSE_S every `every_s`, and times each replica's way back."""

    def __init__(self, redis: subprocess.Popen, port: int, base: str, every_s: float) -> None:
        self._redis, self._port, self._base, self._every_s = redis, port, base, every_s
        self.pauses: list[Pause] = []

    async def run(self, session: aiohttp.ClientSession, started: float, stop: float) -> None:
        at = started + self._every_s
        while at + PAUSE_S + SETTLE_S < stop:
            await asyncio.sleep(at - time.monotonic())
            self.pauses.append(await self._pause(session, at - started))
            at += self._every_s

    async def _pause(self, session: aiohttp.ClientSession, at_s: float) -> Pause:
        degraded = False
        os.kill(self._redis.pid, signal.SIGSTOP)
        try:
            ends = time.monotonic() + PAUSE_S
            while time.monotonic() < ends:
                degraded |= await any_degraded(session, self._base) is True
                await asyncio.sleep(0.2)
        finally:
            os.kill(self._redis.pid, signal.SIGCONT)
        answered = await self._answered()
        while time.monotonic() < answered + SETTLE_S:
            if await any_degraded(session, self._base) is False:
                return Pause(at_s, degraded, time.monotonic() - answered)
            await asyncio.sleep(0.1)
        return Pause(at_s, degraded, None)

    async def _answered(self) -> float:
        """When Redis answers a PING again."""
        while True:
            if await asyncio.to_thread(redis_answers, self._port):
                return time.monotonic()
            await asyncio.sleep(0.05)


async def any_degraded(session: aiohttp.ClientSession, base: str) -> bool | None:
    """Whether any worker is degraded (`/metrics` takes the largest of their flags); None
    unless every worker reported."""
    try:
        async with session.get(base + "/metrics") as answer:
            page = await answer.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    values = dict(metric_lines(page, ("sluicegate_store_degraded", "sluicegate_workers_reporting")))
    if values.get("sluicegate_workers_reporting") != WORKERS:
        return None
    return values.get("sluicegate_store_degraded", 1.0) != 0


def metric_lines(page: str, names: tuple[str, ...]) -> Iterator[tuple[str, float]]:
    for line in page.splitlines():
        name, _, value = line.partition(" ")
        if name.split("{")[0] in names:
            yield name, float(value)


def processes(parent: psutil.Process) -> list[psutil.Process]:
    """The gateway: the supervisor and its workers, whichever are alive now."""
    return [parent, *parent.children(recursive=True)]


def measure(parent: psutil.Process, pids: set[int] | None = None) -> tuple[float, int]:
    """RSS (MiB) and open fds, summed over the gateway's processes (whose ids go to
    `pids`)."""
    rss, fds = 0, 0
    for process in processes(parent):
        with contextlib.suppress(psutil.NoSuchProcess):
            rss += process.memory_info().rss
            fds += process.num_fds()
            if pids is not None:
                pids.add(process.pid)
    return rss / 2**20, fds


@dataclass
class Run:
    counts: Counter[str]
    hostile: Hostile
    pauses: list[Pause]
    rows: list[tuple[float, float, int]] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)
    """Every gateway process seen: the supervisor and its workers, and any that replaced
    one."""

    async def sample(self, parent: psutil.Process, stop: float) -> None:
        started = time.monotonic()
        while time.monotonic() < stop:
            self.rows.append((time.monotonic() - started, *measure(parent, self.pids)))
            await asyncio.sleep(SAMPLE_S)


@dataclass(frozen=True)
class Afterwards:
    """The gateway once the clients had stopped."""

    fds_before: int
    """Before the clients started."""
    fds_after: int
    settled_s: float
    drained_s: float | None
    """How long the jobs the clients left took to run (None: longer than DRAIN_S)."""
    active_attempts: float


async def drive(
    base: str, port: int, gateway: psutil.Process, redis: RedisPauses, seconds: float, seed: int
) -> Run:
    traffic = Traffic(base, port)
    models = Models(chat="chat", anthropic="claude", embed="embed")
    hostile = Hostile(base, Draws(seed, KEYS, models, MAX_BODY, MAX_FILE))
    run = Run(traffic.counts, hostile, redis.pauses)
    started = time.monotonic()
    stop = started + seconds
    limits = aiohttp.TCPConnector(limit=ORDINARY + HOSTILE["cancelled"] + len(ROUTES) + 4)
    async with aiohttp.ClientSession(connector=limits) as session:
        jobs: list[Awaitable[None]] = [run.sample(gateway, stop)]
        jobs += [redis.run(session, started, stop)]
        jobs += [traffic.ordinary(session, stop) for _ in range(ORDINARY)]
        jobs += [traffic.cancelled(session, stop) for _ in range(HOSTILE["cancelled"])]
        jobs += [traffic.never_reading(stop) for _ in range(HOSTILE["never_reading"])]
        jobs += [traffic.trickled(stop) for _ in range(HOSTILE["trickled"])]
        jobs += [traffic.idle(stop) for _ in range(HOSTILE["idle"])]
        jobs += [hostile.route(session, route, stop) for route in ROUTES]
        await asyncio.gather(*jobs)
    return run


def mean_near(rows: list[tuple[float, float, int]], column: int, t: float, window: float) -> float:
    values = [row[column] for row in rows if abs(row[0] - t) <= window / 2]
    return sum(values) / len(values)


def plateau(rows: list[tuple[float, float, int]], column: int) -> tuple[float, float, bool]:
    """(value at the midpoint, growth over the second half, growth < 5 % of the former).

    Both ends are means over a window (a twentieth of the run, at least 10 s): the open
    connections of hostile clients come and go, so one sample is noise."""
    span = rows[-1][0]
    window = max(span / 20, 10.0)
    middle = mean_near(rows, column, span / 2, window)
    growth = mean_near(rows, column, span - window / 2, window) - middle
    return middle, growth, growth < 0.05 * middle


def growth_since(rows: list[tuple[float, float, int]], column: int) -> tuple[float, float, bool]:
    """(value at minute 5, or a quarter of a shorter run; growth from there to the end;
    growth < 10 % of the former), with the same windows as `plateau`."""
    span = rows[-1][0]
    window = max(span / 20, 10.0)
    start = mean_near(rows, column, min(WARM_S, span / 4), window)
    growth = mean_near(rows, column, span - window / 2, window) - start
    return start, growth, growth < 0.1 * start


def settle(parent: psutil.Process, before: int) -> tuple[int, float]:
    """The open fds once back to `before` (or after SETTLE_S), and how long that took."""
    started = time.monotonic()
    while True:
        fds = measure(parent)[1]
        waited = time.monotonic() - started
        if fds <= before or waited > SETTLE_S:
            return fds, waited
        time.sleep(0.5)


@dataclass(frozen=True)
class Stored:
    """A tenant's bytes in the job store: as counted against its quota, as stored (files,
    job bodies and results), and what it submitted itself (input files, job bodies)."""

    tenant: str
    counted: int
    stored: int
    submitted: int

    @property
    def ok(self) -> bool:
        return self.counted == self.stored and self.submitted <= QUOTA_BYTES


def stored_bytes(db: Path) -> list[Stored]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        counted = dict(conn.execute("SELECT tenant, bytes FROM tenant_bytes"))
        files: Counter[str] = Counter()
        inputs: Counter[str] = Counter()
        query = "SELECT tenant, purpose, SUM(size) FROM files WHERE size IS NOT NULL GROUP BY 1, 2"
        for tenant, purpose, size in conn.execute(query):
            files[tenant] += size
            inputs[tenant] += size if purpose == "batch" else 0
        bodies: Counter[str] = Counter()
        results: Counter[str] = Counter()
        query = "SELECT tenant, SUM(LENGTH(body)), SUM(COALESCE(LENGTH(result), 0)) FROM jobs"
        for tenant, body, result in conn.execute(query + " GROUP BY 1"):
            bodies[tenant], results[tenant] = body, result
    tenants = sorted(set(counted) | set(files) | set(bodies))
    return [
        Stored(
            tenant,
            counted.get(tenant, 0),
            files[tenant] + bodies[tenant] + results[tenant],
            inputs[tenant] + bodies[tenant],
        )
        for tenant in tenants
    ]


def svg(rows: list[tuple[float, float, int]], pauses: list[Pause]) -> str:
    """RSS and open fds over time, Redis's pauses shaded."""
    width, height, pad = 720, 260, 40
    span = max(rows[-1][0], 1)

    def x(t: float) -> float:
        return pad + (t / span) * (width - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height * 2}">']
    for index, (column, label, colour) in enumerate(
        ((1, "RSS (MiB)", "#1f77b4"), (2, "open fds", "#d62728"))
    ):
        top = index * height
        values = [row[column] for row in rows]
        high = max(values) * 1.1 or 1
        points = " ".join(
            f"{x(row[0]):.1f},{top + height - pad - (row[column] / high) * (height - 2 * pad):.1f}"
            for row in rows
        )
        parts += [
            f'<rect x="{x(p.at_s):.1f}" y="{top + pad}" width="{x(PAUSE_S) - pad:.1f}" '
            f'height="{height - 2 * pad}" fill="#ddd"/>'
            for p in pauses
        ]
        parts += [
            f'<text x="{pad}" y="{top + 20}" font-size="14">{label}: 0 to {high:.0f}, '
            f"over {span:.0f} s; grey: Redis paused</text>",
            f'<line x1="{pad}" y1="{top + height - pad}" x2="{width - pad}" '
            f'y2="{top + height - pad}" stroke="#999"/>',
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>',
        ]
    return "\n".join([*parts, "</svg>"]) + "\n"


def active_attempts(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
        page = answer.read().decode()
    return sum(value for _, value in metric_lines(page, ("sluicegate_pool_active_attempts",)))


def drain(base: str) -> float | None:
    """Seconds until no job is queued or running (the workers' upstream connections are
    part of the fds counted), or None if some still are after DRAIN_S."""
    started = time.monotonic()
    while time.monotonic() < started + DRAIN_S:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
            page = answer.read().decode()
        live = ('sluicegate_jobs{state="queued"}', 'sluicegate_jobs{state="running"}')
        if not sum(
            value for name, value in metric_lines(page, ("sluicegate_jobs",)) if name in live
        ):
            return time.monotonic() - started
        time.sleep(1)
    return None


def wait_workers(base: str, seconds: float = 30) -> None:
    """Until every worker answers on `/metrics`: `/ready` is the first one's answer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
            page = answer.read().decode()
        if (
            dict(metric_lines(page, ("sluicegate_workers_reporting",))).get(
                "sluicegate_workers_reporting"
            )
            == WORKERS
        ):
            return
        time.sleep(0.2)
    raise SystemExit(f"{WORKERS} workers did not all answer")


@dataclass
class Stack:
    """Redis, the simulator and the gateway, each a process on its own port."""

    folder: Path
    redis_port: int = field(default_factory=free_port)
    sim_port: int = field(default_factory=free_port)
    port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def jobs_db(self) -> Path:
        return self.folder / "jobs.db"

    def start(self) -> None:
        folder = self.folder
        redis_args = ["--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", ""]
        redis_args += ["--appendonly", "no", "--dir", str(folder)]
        self.procs.append(launch(["redis-server", *redis_args], folder / "redis.log"))
        sim_args = ["sim", "--port", str(self.sim_port), "--max-num-seqs", "64"]
        sim_args += ["--model", "chat", "--model", "embed"]
        self.procs.append(sluicegate(sim_args, folder / "sim.log"))
        sim_url = f"http://127.0.0.1:{self.sim_port}"
        config = folder / "gateway.yaml"
        config.write_text(yaml.safe_dump(gateway_config(sim_url, self.redis_port, self.jobs_db)))
        serve = ["serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(self.port)]
        self.procs.append(
            sluicegate([*serve, "--workers", str(WORKERS)], folder / "gateway.log", ENV)
        )
        deadline = time.monotonic() + 10
        while not redis_answers(self.redis_port):
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not answer")
            time.sleep(0.1)
        wait_ready(sim_url + "/health")
        wait_ready(self.base + "/ready")
        wait_workers(self.base)

    @property
    def redis(self) -> subprocess.Popen:
        return self.procs[0]

    @property
    def gateway(self) -> subprocess.Popen:
        return self.procs[2]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            children.stop(proc, grace_s=20)

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")


def report(stack: Stack, result: Run, after: Afterwards, out: Path, seed: int) -> bool:
    """Print the figures and each verdict; whether all hold."""
    verdicts: list[bool] = []

    def verdict(ok: bool, line: str) -> None:
        verdicts.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {line}")

    rows = result.rows
    print(f"seed {seed}; traffic: {dict(sorted(result.counts.items()))}")
    for route, tally in result.hostile.tally.items():
        print(
            f"hostile {route}: {sum(tally[k] for k in tally if k.endswith('xx'))} answers, "
            f"{dict(sorted(tally.items()))}"
        )
    for column, name in ((1, "RSS MiB"), (2, "open fds")):
        middle, growth, ok = plateau(rows, column)
        verdict(ok, f"{name}: {middle:.1f} at the midpoint, {growth:+.1f} over the second half")
    start, growth, ok = growth_since(rows, 1)
    warm = min(WARM_S, rows[-1][0] / 4)
    verdict(
        ok,
        f"RSS MiB: {start:.1f} at {warm:.0f} s, {growth:+.1f} ({growth / start:+.1%}) by the end",
    )
    drained = "not within" if after.drained_s is None else f"in {after.drained_s:.0f} s, of"
    print(f"jobs left by the clients ran {drained} {DRAIN_S:.0f} s")
    verdict(
        after.fds_after <= after.fds_before,
        f"open fds: {after.fds_before} before the clients, {after.fds_after} "
        f"{after.settled_s:.1f} s after the jobs they left",
    )
    size = sum(path.stat().st_size for path in stack.folder.glob("jobs.db*"))
    print(f"job store: {size / 2**20:.1f} MiB on disk")
    for stored in stored_bytes(stack.jobs_db):
        verdict(
            stored.ok,
            f"tenant {stored.tenant}: {stored.counted} bytes counted, {stored.stored} stored, "
            f"{stored.submitted} submitted (quota {QUOTA_BYTES})",
        )
    for pause in result.pauses:
        shown = "never" if pause.recovered_s is None else f"{pause.recovered_s:.2f} s"
        ok = pause.recovered_s is not None and pause.recovered_s <= RECOVERY_S
        verdict(
            ok,
            f"Redis paused at {pause.at_s:.0f} s: degraded {pause.degraded}, "
            f"every replica shared again {shown} after Redis answered",
        )
    problems = result.hostile.problems
    verdict(not problems, f"hostile answers out of the rules: {len(problems)} {problems[:5]}")
    verdict(
        not after.active_attempts, f"pool attempts active afterwards: {after.active_attempts:g}"
    )
    print(f"gateway processes seen: {len(result.pids)} (1 + {WORKERS} workers: none replaced)")
    for name in ("gateway", "sim"):
        found = stack.log(name).count("Traceback")
        verdict(not found, f"tracebacks in the {name} log: {found}")
    print(f"samples: {out / 'soak.csv'}, plot: {out / 'soak.svg'}, logs: {stack.folder}")
    return all(verdicts)


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1200
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "bench/results/soak")
    out.mkdir(parents=True, exist_ok=True)
    seed = int(os.environ.get("SLUICEGATE_SOAK_SEED") or secrets.randbits(32))
    stack = Stack(Path(tempfile.mkdtemp(prefix="sluicegate-soak-")))
    try:
        stack.start()
        parent = psutil.Process(stack.gateway.pid)
        before = measure(parent)[1]
        every_s = min(PAUSE_EVERY_S, seconds / 3)
        pauses = RedisPauses(stack.redis, stack.redis_port, stack.base, every_s)
        result = asyncio.run(drive(stack.base, stack.port, parent, pauses, seconds, seed))
        drained = drain(stack.base)
        fds, settled = settle(parent, before)
        after = Afterwards(before, fds, settled, drained, active_attempts(stack.base))
    finally:
        stack.stop()
    with (out / "soak.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", "rss_mib", "open_fds"])
        writer.writerows((f"{t:.1f}", f"{rss:.2f}", fds) for t, rss, fds in result.rows)
    (out / "soak.svg").write_text(svg(result.rows, result.pauses))
    return 0 if report(stack, result, after, out, seed) else 1


if __name__ == "__main__":
    raise SystemExit(main())
