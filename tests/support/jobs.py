"""A gateway with durable jobs in front of a simulator, its store, and a small job client."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import yaml

from tests.support.postgres import POSTGRES_DSN, connect_or_skip
from tests.support.processes import Proc, start

SIM_KEY = "sim-secret"
KEYS = {"alice": "sk-jobs-alice", "bob": "sk-jobs-bob"}
ENV = {"ALICE_KEY": KEYS["alice"], "BOB_KEY": KEYS["bob"], "SIM_KEY": SIM_KEY}
CHAT = "/v1/chat/completions"
ONE_AT_A_TIME = {"workers": 1, "handoff_size": 1}
"""One worker and a hand-off of one: a long job makes the next ones wait."""
STORES = ("sqlite", "postgres")
FINAL = {"succeeded", "failed", "cancelled", "expired", "superseded"}


def chat(max_tokens: int = 3, **extra) -> dict:
    messages = [{"role": "user", "content": "hello"}]
    return {"model": "chat", "messages": messages, "max_tokens": max_tokens, **extra}


@dataclass
class JobDatabase:
    """The store a gateway is configured with, read here over a connection of our own."""

    keys: dict
    path: Path | None = None
    schema: str | None = None

    async def job_ids(self) -> set[str]:
        if self.path is not None:
            with contextlib.closing(sqlite3.connect(self.path)) as conn:
                return {row[0] for row in conn.execute("SELECT id FROM jobs")}
        conn = await asyncpg.connect(POSTGRES_DSN)
        try:
            return {row["id"] for row in await conn.fetch(f"SELECT id FROM {self.schema}.jobs")}
        finally:
            await conn.close()


async def job_database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[JobDatabase]:
    """A fixture, once a test module declares it with `params=STORES` (and any scope): a
    fresh SQLite file, or a fresh PostgreSQL schema dropped afterwards; without a
    reachable PostgreSQL its tests are skipped, unless `CI=true`."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("jobs") / "jobs.db"
        yield JobDatabase({"sqlite_path": str(path)}, path=path)
        return
    conn = await connect_or_skip()
    schema = f"sluicegate_e2e_{uuid.uuid4().hex[:12]}"
    keys = {"store": "postgres", "postgres_dsn": POSTGRES_DSN, "postgres_schema": schema}
    try:
        yield JobDatabase(keys, schema=schema)
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


def sqlite_jobs(folder: Path, **keys) -> dict:
    """The `jobs:` section of a gateway storing its jobs in `folder`/jobs.db."""
    return {"sqlite_path": str(folder / "jobs.db"), **keys}


def start_sim(folder: Path, *flags: str) -> Proc:
    return start("sim", ["--model", "sim-model", "--api-key", SIM_KEY, *flags], folder)


def gateway_config(sim: Proc, jobs: dict, pool: int = 64, **top) -> dict:
    """Models `chat` and `private` on one pool of `pool`; bob may use only `chat`."""

    def model(name: str) -> dict:
        deployment = {
            "name": f"sim-{name}",
            "base_url": f"{sim.url}/v1",
            "model": "sim-model",
            "api_key_env": "SIM_KEY",
            "pools": ["p"],
        }
        return {"name": name, "deployments": [deployment]}

    return {
        "routes": {"chat": {"retry": {"max_attempts": 1}}},
        "pools": [{"name": "p", "max_concurrency": pool}],
        "models": [model("chat"), model("private")],
        "tenants": [
            {"name": "alice", "keys": [{"env": "ALICE_KEY"}]},
            {"name": "bob", "keys": [{"env": "BOB_KEY"}], "models": ["chat"]},
        ],
        "jobs": {"expiry_sweep_s": 0.2, "poll_s": 0.2, **jobs},
        **top,
    }


def start_gateway(folder: Path, config: dict, env: dict[str, str] = ENV) -> Proc:
    path = folder / f"gateway-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(config))
    return start("serve", ["--config", str(path)], folder, env=env, ready_path="/ready")


class JobClient:
    """One tenant's view of the job API, over raw HTTP."""

    def __init__(self, http: aiohttp.ClientSession, gateway: Proc, tenant: str) -> None:
        self.http = http
        self.url = f"{gateway.url}/v1/jobs"
        self.headers = {"Authorization": f"Bearer {KEYS[tenant]}"}

    async def submit(
        self, body: dict | None = None, headers: dict | None = None, **fields
    ) -> tuple[int, dict, dict]:
        spec = {"endpoint": CHAT, "body": body or chat(), **fields}
        sent = self.headers | (headers or {})
        async with self.http.post(self.url, json=spec, headers=sent) as resp:
            return resp.status, dict(resp.headers), await resp.json()

    async def accepted(self, body: dict | None = None, **fields) -> dict:
        status, _, doc = await self.submit(body, **fields)
        assert status == 202, doc
        return doc

    async def call(self, method: str, path: str = "") -> tuple[int, dict]:
        async with self.http.request(method, self.url + path, headers=self.headers) as resp:
            return resp.status, await resp.json()

    async def get(self, job_id: str) -> dict:
        status, doc = await self.call("GET", f"/{job_id}")
        assert status == 200, doc
        return doc

    async def wait(
        self, job_id: str, states: set[str], timeout_s: float = 15.0, with_error: bool = False
    ) -> dict:
        """Poll, as a job's caller does, until the job is in one of `states` (and, if
        asked, went back there with an error)."""
        async with asyncio.timeout(timeout_s):
            while True:
                doc = await self.get(job_id)
                if doc["status"] in states and (doc["last_error"] or not with_error):
                    return doc
                await asyncio.sleep(0.02)

    async def final(self, job_ids: list[str], timeout_s: float = 20.0) -> dict[str, dict]:
        docs: dict[str, dict] = {}
        async with asyncio.timeout(timeout_s):
            for job_id in job_ids:
                docs[job_id] = await self.wait(job_id, FINAL, timeout_s)
        return docs
