"""`sluicegate serve --workers N`: several processes on one port, one server (MISSION 9).

The workers are real processes started by a real supervisor; limits are shared through
the machine's Redis under a key prefix of the test's own; the upstream is the shared
simulator. Which worker answered a request is read from `/admin/status`, whose
`per_worker` documents count each worker's answered requests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import SIM_KEY, sim_stats
from tests.e2e.test_fleet import fleet_config, key_of
from tests.support.jobs import start_sim
from tests.support.processes import Proc, free_port, start
from tests.support.redis import REDIS_URL, redis_or_skip

ADMIN = "sk-workers-admin"
MESSAGES = [{"role": "user", "content": "hello there"}]


def write_config(folder: Path, sim: Proc, prefix: str, pool: dict, **extra) -> Path:
    config = fleet_config(sim.url, "${REDIS_URL}", prefix, pool=pool)
    config["admin"] = {"keys": [{"env": "WORKERS_ADMIN_KEY"}]}
    config |= extra
    path = folder / "workers.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


ENV = {
    "SIM_KEY": SIM_KEY,
    "REDIS_URL": REDIS_URL,
    "FLEET_KEY_T": key_of("t"),
    "WORKERS_ADMIN_KEY": ADMIN,
}


@pytest.fixture
async def server(sim: Proc, http: aiohttp.ClientSession, tmp_path: Path) -> AsyncIterator[Proc]:
    async with redis_or_skip() as (_, prefix):
        async with http.post(f"{sim.url}/sim/reset") as resp:
            assert resp.status == 200
        path = write_config(tmp_path, sim, prefix, {"max_concurrency": 8})
        proc = start(
            "serve",
            ["--config", str(path), "--workers", "2"],
            tmp_path,
            env=ENV,
            ready_path="/ready",
        )
        try:
            await wait_all_answering(http, proc)
            yield proc
        finally:
            proc.stop()


async def status(http: aiohttp.ClientSession, proc: Proc) -> dict:
    """Over a fresh connection each time, so any worker may answer."""
    headers = {"Authorization": f"Bearer {ADMIN}", "Connection": "close"}
    async with http.get(f"{proc.url}/admin/status", headers=headers) as resp:
        assert resp.status == 200
        return await resp.json()


async def wait_all_answering(
    http: aiohttp.ClientSession, proc: Proc, timeout_s: float = 20
) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        document = await status(http, proc)
        if document["workers"]["answered"] == [0, 1]:
            return document
        await asyncio.sleep(0.1)
    raise AssertionError(f"the workers did not all answer within {timeout_s}s")


async def flood(proc: Proc, total: int, width: int) -> list[int]:
    """`total` requests from `width` callers, each request on a new connection, so the
    kernel chooses a worker for every one of them."""
    connector = aiohttp.TCPConnector(force_close=True, limit=width)
    timeout = aiohttp.ClientTimeout(total=30)
    payload = {"model": "chat", "messages": MESSAGES, "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key_of('t')}"}
    statuses: list[int] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def caller() -> None:
            while len(statuses) < total:
                statuses.append(0)
                mine = len(statuses) - 1
                url = f"{proc.url}/v1/chat/completions"
                async with session.post(url, json=payload, headers=headers) as resp:
                    await resp.read()
                    statuses[mine] = resp.status

        await asyncio.gather(*(caller() for _ in range(width)))
    return statuses


async def test_two_workers_share_connections_and_hold_the_pool_as_one(server, http, sim):
    statuses = await flood(server, total=2000, width=48)
    document = await wait_all_answering(http, server)
    answered = {i: doc["answered"] for i, doc in document["per_worker"].items()}
    assert sum(answered.values()) == 2000
    assert min(answered.values()) >= 0.35 * 2000, answered
    assert (await sim_stats(http, sim))["max_in_flight"] <= 8
    assert statuses.count(200) >= 20
    assert statuses.count(503) >= 200  # the shared pool refused the rest
    assert set(statuses) <= {200, 503}
    assert document["server"]["answered"] == 2000


async def test_metrics_on_any_worker_report_the_whole_server(server, http):
    await flood(server, total=200, width=8)
    seen: set[int] = set()
    while len(seen) < 2:
        document = await status(http, server)
        seen.add(document["worker"])
        assert document["server"]["answered"] == 200
        async with http.get(f"{server.url}/metrics", headers={"Connection": "close"}) as resp:
            text = await resp.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        requests = sum(s.value for s in families["sluicegate_requests"].samples)
        assert requests == 200
        judged = families["sluicegate_request_outcomes"].samples
        assert sum(s.value for s in judged if s.name.endswith("_total")) == 200
        lanes = document["server"]["slo"]["models"]["chat"].values()
        assert sum(lane["offered"] for lane in lanes) == 200
        for lane in lanes:
            if lane["accepted"]:
                assert lane["attainment"] == round(lane["met"] / lane["accepted"], 4)
        [limit] = families["sluicegate_pool_concurrency_limit"].samples
        assert limit.value == 8  # the same setting in each worker: not summed
        [reporting] = families["sluicegate_workers_reporting"].samples
        assert reporting.value == 2


async def test_the_status_pages_feed_on_any_worker_shows_the_whole_server(server, http):
    await flood(server, total=100, width=8)
    headers = {"Authorization": f"Bearer {ADMIN}", "Connection": "close"}
    seen: set[int] = set()
    while len(seen) < 2:
        async with http.get(f"{server.url}/admin/live", headers=headers) as resp:
            assert resp.status == 200
            line = await asyncio.wait_for(resp.content.readline(), 10)
        document = orjson.loads(line.removeprefix(b"data: "))["status"]
        seen.add(document["worker"])
        assert document["workers"]["answered"] == [0, 1]
        seconds = document["server"]["history"]["seconds"].values()
        assert sum(second["offered"] for second in seconds) == 100
        [pool] = document["server"]["pools"].values()
        assert pool["limit"] == 8


async def replaced(server: Proc, victim: int, within_s: float) -> None:
    """Wait until the server again runs two workers, `victim` not among them."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        now = children_of(server.popen.pid)
        if len(now) == 2 and victim not in now:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"worker {victim} was not replaced:\n{server.output()}")


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_dead_worker_is_replaced_and_sigterm_stops_every_worker(server, http):
    parent = server.popen.pid
    first = children_of(parent)
    assert len(first) == 2
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    await replaced(server, victim, within_s=20)
    await wait_all_answering(http, server)
    assert "exited with -9; restarting it" in server.output()
    workers = children_of(parent)
    server.popen.send_signal(signal.SIGTERM)
    assert server.popen.wait(timeout=20) == 0
    assert not any(alive(pid) for pid in workers)


async def test_a_worker_that_stops_answering_is_killed_and_replaced(server, http):
    """A stopped process holds its connections and answers nothing: the parent finds
    it out on its sibling socket and replaces it, and the server answers on: after three
    missed asks five seconds apart if it had answered one, else once its 30 s to start
    are over."""
    parent = server.popen.pid
    victim = min(children_of(parent))
    os.kill(victim, signal.SIGSTOP)
    await replaced(server, victim, within_s=60)
    await wait_all_answering(http, server)
    assert "stopped answering and was killed" in server.output()
    assert not alive(victim)


def test_memory_store_with_several_workers_is_refused(tmp_path, sim):
    config = write_config(tmp_path, sim, "unused:", {"max_concurrency": 8})
    settings = yaml.safe_load(config.read_text())
    del settings["store"], settings["redis"]
    config.write_text(yaml.safe_dump(settings))
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(config), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **ENV},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--workers 2 needs store: redis" in lines[0]
    assert "2 times every limit" in lines[0]


async def test_workers_share_one_sqlite_job_file_and_claim_each_job_once(sim, http, tmp_path):
    """SQLite's `BEGIN IMMEDIATE` makes each claim exclusive across processes: every job
    runs once (one claim, one upstream request) though both workers claim from the file."""
    async with redis_or_skip() as (_, prefix):
        async with http.post(f"{sim.url}/sim/reset") as resp:
            assert resp.status == 200
        jobs = {"sqlite_path": str(tmp_path / "jobs.db"), "poll_s": 0.05, "workers": 4}
        path = write_config(tmp_path, sim, prefix, {"max_concurrency": 64}, jobs=jobs)
        args = ["--config", str(path), "--workers", "2"]
        proc = start("serve", args, tmp_path, env=ENV, ready_path="/ready")
        try:
            headers = {"Authorization": f"Bearer {key_of('t')}"}
            spec = {
                "endpoint": "/v1/chat/completions",
                "body": {"model": "chat", "messages": MESSAGES, "max_tokens": 2},
            }
            ids = []
            for _ in range(150):
                async with http.post(f"{proc.url}/v1/jobs", json=spec, headers=headers) as resp:
                    assert resp.status == 202
                    ids.append((await resp.json())["id"])
            docs = {}
            async with asyncio.timeout(60):
                for job_id in ids:
                    while True:
                        async with http.get(
                            f"{proc.url}/v1/jobs/{job_id}", headers=headers
                        ) as resp:
                            doc = await resp.json()
                        if doc["status"] not in ("queued", "running"):
                            docs[job_id] = doc
                            break
                        await asyncio.sleep(0.05)
            document = await wait_all_answering(http, proc)
        finally:
            proc.stop()
    assert {doc["status"] for doc in docs.values()} == {"succeeded"}
    assert {doc["attempts"] for doc in docs.values()} == {1}
    assert (await sim_stats(http, sim))["received"] == 150
    ran = [doc["answered"] for doc in document["per_worker"].values()]
    assert sum(ran) == 150
    assert min(ran) > 0  # both workers claimed jobs from the one file


async def test_sigterm_lets_requests_in_flight_finish(server, http):
    """Each worker gets one SIGTERM and drains as a single gateway does: a request in
    flight when the server is told to stop still gets its whole answer."""
    payload = {"model": "chat", "messages": MESSAGES, "max_tokens": 120}
    headers = {"Authorization": f"Bearer {key_of('t')}"}

    async def slow() -> tuple[int, dict]:
        url = f"{server.url}/v1/chat/completions"
        async with http.post(url, json=payload, headers=headers) as resp:
            return resp.status, await resp.json()

    calls = [asyncio.create_task(slow()) for _ in range(4)]
    await asyncio.sleep(0.4)
    assert not any(call.done() for call in calls)
    server.popen.send_signal(signal.SIGTERM)
    answers = await asyncio.gather(*calls)
    assert [status for status, _ in answers] == [200] * 4
    assert all(body["usage"]["completion_tokens"] == 120 for _, body in answers)
    assert await asyncio.to_thread(server.popen.wait, 20) == 0


async def test_workers_started_with_redis_down_admit_each_limit_once(http, tmp_path):
    """Both workers start degraded: each enforces its share of the pool, half of it, so
    the backend never sees more than the pool though both take requests."""
    slow = start_sim(tmp_path, "--step-base-ms", "100")
    path = write_config(tmp_path, slow, "down:", {"max_concurrency": 2})
    env = ENV | {"REDIS_URL": f"redis://127.0.0.1:{free_port()}"}
    proc = start("serve", ["--config", str(path), "--workers", "2"], tmp_path, env=env)
    try:
        await wait_all_answering(http, proc)
        statuses = await flood(proc, total=300, width=12)
        document = await wait_all_answering(http, proc)
        answered = [doc["answered"] for doc in document["per_worker"].values()]
        assert min(answered) >= 50, answered
        assert statuses.count(200) >= 2
        assert (await sim_stats(http, slow))["max_in_flight"] <= 2
        assert "as one of 2 replicas" in proc.log.read_text()
    finally:
        proc.stop()
        slow.stop()
