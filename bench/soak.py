"""Soak: mixed traffic with hostile clients mixed in, sampling the gateway's RSS and
open file descriptors over time.

Starts a simulator and a gateway (loopback), then for DURATION seconds runs:
- ordinary clients: chat (streamed and not), completions and embeddings, closed loop;
- cancelled requests: streams abandoned after a random delay;
- never-reading streams: raw sockets with a 4 KiB receive window that never read;
- trickled bodies: a byte of body per second;
- idle connections: opened and left silent.
Every SAMPLE_S (1 s) it records the gateway's RSS and open fds. Writes soak.csv and soak.svg
to OUT and prints the plateau verdict: growth over the second half of the run below
5 % of the value at its midpoint (for the 20-minute run: the last 10 minutes against
the value at 10 minutes). Afterwards the pool's active attempts must be back at zero.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/soak.py 1200 bench/results/soak
"""

from __future__ import annotations

import asyncio
import csv
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yaml

SAMPLE_S = 1.0
KEY = "sk-soak"
HOSTILE = {"never_reading": 6, "trickled": 6, "idle": 20, "cancelled": 4}
ORDINARY = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sluicegate", *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )


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


def gateway_config(sim_url: str) -> dict:
    return {
        "server": {"header_timeout_s": 5, "body_timeout_s": 5, "write_timeout_s": 5},
        "pools": [{"name": "sim", "max_concurrency": 32}],
        "models": [
            {
                "name": name,
                "deployments": [
                    {"name": f"sim-{name}", "base_url": f"{sim_url}/v1", "pools": ["sim"]}
                ],
            }
            for name in ("chat", "embed")
        ],
        "routes": {"chat": {"max_output_tokens": 64}},
        "tenants": [
            {"name": "soak", "keys": [{"env": "SOAK_KEY"}], "limits": {"max_concurrency": 64}}
        ],
    }


class Traffic:
    def __init__(self, base: str, port: int) -> None:
        self.base, self.port = base, port
        self.headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
        self.counts: dict[str, int] = {}

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def ordinary(self, session: aiohttp.ClientSession, stop: float) -> None:
        rng = random.Random()
        while time.monotonic() < stop:
            kind = rng.choice(["chat", "chat_stream", "completions", "embeddings"])
            path, body = {
                "chat": ("/v1/chat/completions", {"model": "chat", "messages": MESSAGES}),
                "chat_stream": (
                    "/v1/chat/completions",
                    {"model": "chat", "messages": MESSAGES, "stream": True},
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


async def sample(
    process: psutil.Process, stop: float, rows: list[tuple[float, float, int]]
) -> None:
    started = time.monotonic()
    while time.monotonic() < stop:
        rows.append(
            (time.monotonic() - started, process.memory_info().rss / 2**20, process.num_fds())
        )
        await asyncio.sleep(SAMPLE_S)


async def drive(
    base: str, port: int, gateway: psutil.Process, seconds: float
) -> tuple[dict[str, int], list[tuple[float, float, int]]]:
    traffic = Traffic(base, port)
    rows: list[tuple[float, float, int]] = []
    stop = time.monotonic() + seconds
    limits = aiohttp.TCPConnector(limit=ORDINARY + HOSTILE["cancelled"] + 4)
    async with aiohttp.ClientSession(connector=limits) as session:
        jobs = [sample(gateway, stop, rows)]
        jobs += [traffic.ordinary(session, stop) for _ in range(ORDINARY)]
        jobs += [traffic.cancelled(session, stop) for _ in range(HOSTILE["cancelled"])]
        jobs += [traffic.never_reading(stop) for _ in range(HOSTILE["never_reading"])]
        jobs += [traffic.trickled(stop) for _ in range(HOSTILE["trickled"])]
        jobs += [traffic.idle(stop) for _ in range(HOSTILE["idle"])]
        await asyncio.gather(*jobs)
    return traffic.counts, rows


def plateau(rows: list[tuple[float, float, int]], column: int) -> tuple[float, float, bool]:
    """(value at the midpoint, growth over the second half, growth < 5 % of the former).

    Both ends are means over a window (a twentieth of the run, at least 10 s): the open
    connections of hostile clients come and go, so one sample is noise."""
    span = rows[-1][0]
    window = max(span / 20, 10.0)

    def mean_near(t: float) -> float:
        values = [row[column] for row in rows if abs(row[0] - t) <= window / 2]
        return sum(values) / len(values)

    middle = mean_near(span / 2)
    growth = mean_near(span - window / 2) - middle
    return middle, growth, growth < 0.05 * middle


def svg(rows: list[tuple[float, float, int]]) -> str:
    width, height, pad = 720, 260, 40
    span = max(rows[-1][0], 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height * 2}">']
    for index, (column, label, colour) in enumerate(
        ((1, "RSS (MiB)", "#1f77b4"), (2, "open fds", "#d62728"))
    ):
        top = index * height
        values = [row[column] for row in rows]
        high = max(values) * 1.1 or 1
        points = " ".join(
            f"{pad + (row[0] / span) * (width - 2 * pad):.1f},"
            f"{top + height - pad - (row[column] / high) * (height - 2 * pad):.1f}"
            for row in rows
        )
        parts += [
            f'<text x="{pad}" y="{top + 20}" font-size="14">{label}: 0 to {high:.0f}, '
            f"over {span:.0f} s</text>",
            f'<line x1="{pad}" y1="{top + height - pad}" x2="{width - pad}" '
            f'y2="{top + height - pad}" stroke="#999"/>',
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>',
        ]
    return "\n".join([*parts, "</svg>"]) + "\n"


def active_attempts(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sluicegate_pool_active_attempts{")
    )


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1200
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "bench/results/soak")
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="sluicegate-soak-"))
    sim_port, gw_port = free_port(), free_port()
    sim = spawn(
        [
            "sim",
            "--port",
            str(sim_port),
            "--model",
            "chat",
            "--model",
            "embed",
            "--max-num-seqs",
            "64",
        ],
        folder / "sim.log",
    )
    config = folder / "gateway.yaml"
    config.write_text(yaml.safe_dump(gateway_config(f"http://127.0.0.1:{sim_port}")))
    gateway = spawn(
        ["serve", "--config", str(config), "--port", str(gw_port)],
        folder / "gateway.log",
        {"SOAK_KEY": KEY},
    )
    base = f"http://127.0.0.1:{gw_port}"
    try:
        wait_ready(f"http://127.0.0.1:{sim_port}/health")
        wait_ready(base + "/ready")
        counts, rows = asyncio.run(drive(base, gw_port, psutil.Process(gateway.pid), seconds))
        time.sleep(6)
        left = active_attempts(base)
    finally:
        for proc in (gateway, sim):
            proc.terminate()
            proc.wait(20)
    with (out / "soak.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", "rss_mib", "open_fds"])
        writer.writerows((f"{t:.1f}", f"{rss:.2f}", fds) for t, rss, fds in rows)
    (out / "soak.svg").write_text(svg(rows))
    log = (folder / "gateway.log").read_text(errors="replace")
    print(f"traffic: {dict(sorted(counts.items()))}")
    verdicts = []
    for column, name in ((1, "RSS MiB"), (2, "open fds")):
        middle, growth, ok = plateau(rows, column)
        verdicts.append(ok)
        print(
            f"{name}: {middle:.1f} at the midpoint, {growth:+.1f} over the second half: "
            f"{'plateau' if ok else 'GROWING'}"
        )
    print(f"pool attempts active afterwards: {left:g}")
    print(f"tracebacks in the gateway log: {log.count('Traceback')}")
    print(f"samples: {out / 'soak.csv'}, plot: {out / 'soak.svg'}")
    return 0 if all(verdicts) and left == 0 and "Traceback" not in log else 1


if __name__ == "__main__":
    raise SystemExit(main())
