"""A 50,000-line batch end to end, on SQLite or PostgreSQL, then the store after retention.

Starts, on loopback, a zero-latency simulator and a gateway in front of it, then:

- submit: uploads a JSONL file of N chat requests (multipart, as the SDK sends it) and
  creates a batch from it; the time of each;
- memory: the gateway's resident memory before the upload, and its peak (sampled every
  20 ms) during submit, from creation to completion (the output file written included),
  during the download, and over the whole run;
- complete: from the batch's creation until a poll answers `completed`;
- output: how long the batch was `finalizing` (its results read and the output file
  written), from the store's own times, the file's size and chunks, and the time to
  download it;
- retention: the store's size once the batch completed, then once `retention_s` passed
  and the sweep deleted the batch, its jobs and its files.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/batch_scale.py --store sqlite
    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/batch_scale.py --store postgres

PostgreSQL: SLUICEGATE_BENCH_POSTGRES_DSN (default postgresql://postgres@127.0.0.1:5432/test),
in a schema of the run's own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import yaml

from sluicegate.bench.procs import Child, ProcessMeter, service

DSN = os.environ.get("SLUICEGATE_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
CHAT = "/v1/chat/completions"
RETENTION_S = 20.0
MB = 1024 * 1024


def config(store: dict[str, Any]) -> str:
    deployment = {"name": "sim", "base_url": "${SIM_URL}", "model": "sim-model", "pools": ["p"]}
    return yaml.safe_dump(
        {
            "pools": [{"name": "p", "max_concurrency": 64}],
            "models": [{"name": "chat", "deployments": [deployment]}],
            "tenants": [{"name": "bench", "keys": [{"env": "BENCH_KEY"}]}],
            "jobs": {
                "workers": 32,
                "handoff_size": 64,
                "poll_s": 0.1,
                "max_file_bytes": 64 * MB,
                "retention_s": RETENTION_S,
                "retention_sweep_s": 1.0,
                **store,
            },
        }
    )


def input_file(lines: int) -> bytes:
    def line(i: int) -> bytes:
        messages = [{"role": "user", "content": f"q{i}"}]
        body = {"model": "chat", "messages": messages, "max_tokens": 4}
        return orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": body})

    return b"\n".join(line(i) for i in range(lines)) + b"\n"


class PeakMeter:
    """The gateway's resident memory, sampled until stopped; `mark` starts a new window."""

    def __init__(self, gateway: Child) -> None:
        self._meter = ProcessMeter(gateway.popen.pid)
        self.baseline = self._meter.rss_bytes()
        self.window_peak = self.overall_peak = self.baseline
        self._task = asyncio.ensure_future(self._sample())

    def mark(self) -> int:
        peak, self.window_peak = self.window_peak, self._meter.rss_bytes()
        return peak

    async def _sample(self) -> None:
        while True:
            rss = self._meter.rss_bytes()
            self.window_peak = max(self.window_peak, rss)
            self.overall_peak = max(self.overall_peak, rss)
            await asyncio.sleep(0.02)

    def stop(self) -> None:
        self._task.cancel()


class Store:
    """The gateway's database, read over a connection of the bench's own."""

    def __init__(self, kind: str, folder: Path) -> None:
        self.kind = kind
        self.path = folder / "jobs.db"
        self.schema = f"sluicegate_bench_{secrets.token_hex(6)}"

    def keys(self) -> dict[str, Any]:
        if self.kind == "sqlite":
            return {"sqlite_path": str(self.path)}
        return {"store": "postgres", "postgres_dsn": DSN, "postgres_schema": self.schema}

    async def finalizing_s(self, batch_id: str) -> float:
        query = "SELECT status_at FROM {}batches WHERE id = {}"
        if self.kind == "sqlite":
            with sqlite3.connect(self.path) as conn:
                [row] = conn.execute(query.format("", "?"), (batch_id,)).fetchall()
            text = row[0]
        else:
            conn = await asyncpg.connect(DSN)
            try:
                text = await conn.fetchval(query.format(self.schema + ".", "$1"), batch_id)
            finally:
                await conn.close()
        times = orjson.loads(text)
        return float(times["completed"] - times["finalizing"])

    async def size(self) -> dict[str, int]:
        """Rows of each table, and bytes: the live pages of the SQLite file (the file keeps
        freed pages for reuse), or PostgreSQL's total relation size of the schema."""
        tables = ("jobs", "batches", "files", "file_chunks")
        if self.kind == "sqlite":
            with sqlite3.connect(self.path) as conn:
                rows = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                free = conn.execute("PRAGMA freelist_count").fetchone()[0]
                page = conn.execute("PRAGMA page_size").fetchone()[0]
            files = sum(p.stat().st_size for p in self.path.parent.glob("jobs.db*"))
            return rows | {"live_bytes": (pages - free) * page, "file_bytes": files}
        conn = await asyncpg.connect(DSN)
        try:
            count = f"SELECT COUNT(*) FROM {self.schema}.{{}}"
            rows = {t: await conn.fetchval(count.format(t)) for t in tables}
            total = await conn.fetchval(
                "SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1 AND c.relkind = 'r'",
                self.schema,
            )
            return rows | {"relation_bytes": int(total)}
        finally:
            await conn.close()

    async def drop(self) -> None:
        if self.kind == "postgres":
            conn = await asyncpg.connect(DSN)
            try:
                await conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            finally:
                await conn.close()


@dataclass(frozen=True)
class Download:
    size: int
    lines: int
    seconds: float


async def download(http: aiohttp.ClientSession, file_id: str) -> Download:
    """The file's content as a client streams it, counted as it arrives, never kept."""
    started = time.perf_counter()
    size = lines = 0
    async with http.get(f"/v1/files/{file_id}/content") as resp:
        assert resp.status == 200, await resp.text()
        async for data in resp.content.iter_any():
            size, lines = size + len(data), lines + data.count(b"\n")
        assert size == int(resp.headers["content-length"])
    return Download(size, lines, time.perf_counter() - started)


async def run(gateway: Child, key: str, store: Store, lines: int) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    content = input_file(lines)
    meter = PeakMeter(gateway)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(gateway.url, headers=headers, timeout=timeout) as http:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename="in.jsonl", content_type="application/jsonl")
        started = time.perf_counter()
        async with http.post("/v1/files", data=form) as resp:
            upload = await resp.json()
            assert resp.status == 200, upload
        uploaded = time.perf_counter()
        spec = {"input_file_id": upload["id"], "endpoint": CHAT, "completion_window": "24h"}
        async with http.post("/v1/batches", json=spec) as resp:
            batch = await resp.json()
            assert resp.status == 200, batch
        created = time.perf_counter()
        submit_peak = meter.mark()
        polls = 0
        while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
            await asyncio.sleep(0.5)
            async with http.get(f"/v1/batches/{batch['id']}") as resp:
                batch = await resp.json()
            polls += 1
        completed = time.perf_counter()
        run_peak = meter.mark()
        output = await download(http, batch["output_file_id"])
        download_peak = meter.mark()
    meter.stop()
    counts = batch["request_counts"]
    print(f"store: {store.kind}, lines: {lines}, input file: {len(content) / MB:.1f} MiB")
    print(f"submit: upload {uploaded - started:.2f} s, create {created - uploaded:.2f} s")
    print(
        f"gateway RSS: before {meter.baseline / MB:.0f} MiB, peak during submit "
        f"{submit_peak / MB:.0f} MiB, from creation to completion {run_peak / MB:.0f} MiB, "
        f"during the download {download_peak / MB:.0f} MiB, "
        f"over the run {meter.overall_peak / MB:.0f} MiB"
    )
    print(
        f"complete: {completed - created:.1f} s after creation ({polls} polls), "
        f"status {batch['status']}, {counts['completed']}/{counts['total']} succeeded"
    )
    print(f"output file: finalizing lasted {await store.finalizing_s(batch['id']):.2f} s")
    print(f"download: {output.size / MB:.1f} MiB, {output.lines} lines in {output.seconds:.2f} s")
    print(f"store after completion: {await store.size()}")
    await asyncio.sleep(RETENTION_S + 5)
    while (after := await store.size())["jobs"]:  # noqa: ASYNC110 (another process deletes)
        await asyncio.sleep(1)
    print(f"store after retention ({RETENTION_S:g} s): {after}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--lines", type=int, default=50_000)
    args = parser.parse_args()
    key = f"sk-bench-{secrets.token_urlsafe(16)}"
    with tempfile.TemporaryDirectory(prefix="sluicegate-bench-") as folder, ExitStack() as stack:
        logs = Path(folder)
        store = Store(args.store, logs)
        (logs / "gateway.yaml").write_text(config(store.keys()))
        try:
            sim = stack.enter_context(service("sim", ["sim", "--time-scale", "0"], "/health", logs))
            serve = ["serve", "--config", str(logs / "gateway.yaml"), "--log-level", "warning"]
            env = {"BENCH_KEY": key, "SIM_URL": f"{sim.url}/v1"}
            gateway = stack.enter_context(service("gateway", serve, "/ready", logs, env))
            asyncio.run(run(gateway, key, store, args.lines))
        finally:
            stack.close()
            asyncio.run(store.drop())


if __name__ == "__main__":
    main()
