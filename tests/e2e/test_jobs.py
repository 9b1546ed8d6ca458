"""Durable jobs through real processes (MISSION 7): a 202 only once the job is stored, no
acknowledged job lost to a SIGKILL, work that ended before dispatch never sent, polls and
cancels answered while the pool is saturated, and workers inside the pools' limits."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import statistics
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import sim_stats
from tests.support.jobs import (
    KEYS,
    ONE_AT_A_TIME,
    STORES,
    JobClient,
    chat,
    gateway_config,
    job_database,
    sqlite_jobs,
    start_gateway,
    start_sim,
)
from tests.support.postgres import StallingProxy, connect_or_skip
from tests.support.processes import Proc

database = pytest.fixture(params=STORES)(job_database)

PATIENT = {"backoff_base_s": 0.05, "backoff_cap_s": 0.2, "max_attempts": 200}
"""Retry refused jobs soon and long enough to outlast a held pool."""


@pytest.fixture
def slow_sim(tmp_path) -> Iterator[Proc]:
    """200 ms per generated token: a few tokens hold a permit for seconds."""
    proc = start_sim(tmp_path, "--step-base-ms", "200")
    yield proc
    proc.stop()


@pytest.fixture
def stopped(tmp_path):
    """Start gateways for one test; every one is stopped afterwards."""
    procs: list[Proc] = []

    def start(config: dict) -> Proc:
        procs.append(start_gateway(tmp_path, config))
        return procs[-1]

    yield start
    for proc in procs:
        proc.stop()


async def test_a_job_is_stored_before_its_202_and_then_runs(database, sim, http, stopped):
    gateway = stopped(gateway_config(sim, database.keys))
    jobs = JobClient(http, gateway, "alice")
    status, headers, doc = await jobs.submit(chat(), idempotency_key="order-7")
    assert (status, doc["status"]) == (202, "queued")
    assert headers["Location"] == f"/v1/jobs/{doc['id']}"
    assert doc["id"] in await database.job_ids()

    repeat = await jobs.submit(chat(max_tokens=9), headers={"Idempotency-Key": "order-7"})
    assert (repeat[0], repeat[2]["id"]) == (200, doc["id"])

    done = await jobs.wait(doc["id"], {"succeeded"})
    assert done["result"]["object"] == "chat.completion"
    assert (done["attempts"], done["error"]) == (1, None)


async def test_a_sigkill_after_the_200th_202_loses_no_acknowledged_job(
    database, http, stopped, tmp_path
):
    fast = start_sim(tmp_path, "--time-scale", "0")
    try:
        config = gateway_config(fast, database.keys | {"lease_s": 2, "heartbeat_s": 0.5})
        gateway = stopped(config)
        jobs = JobClient(http, gateway, "alice")
        acknowledged: list[str] = []

        async def submit_until_killed() -> None:
            while gateway.popen.poll() is None:
                try:
                    status, _, doc = await jobs.submit()
                except aiohttp.ClientError:
                    return
                if status == 202:
                    acknowledged.append(doc["id"])
                if len(acknowledged) >= 200 and gateway.popen.poll() is None:
                    gateway.popen.send_signal(signal.SIGKILL)
                    gateway.popen.wait()

        await asyncio.gather(*(submit_until_killed() for _ in range(16)))
        assert len(acknowledged) >= 200
        assert set(acknowledged) <= await database.job_ids()

        restarted = stopped(config)
        docs = await JobClient(http, restarted, "alice").final(acknowledged, timeout_s=30)
        assert {doc["status"] for doc in docs.values()} == {"succeeded"}
    finally:
        fast.stop()


async def test_work_that_ended_before_dispatch_never_reaches_the_model(
    database, sim, http, stopped
):
    """One worker and a hand-off of one, busy with a long job: the others wait, and end
    (cancelled, expired, superseded) without a model call."""
    gateway = stopped(gateway_config(sim, database.keys | ONE_AT_A_TIME))
    jobs = JobClient(http, gateway, "alice")
    received = (await sim_stats(http, sim))["received"]
    blocker = await jobs.accepted(chat(max_tokens=200))
    await jobs.wait(blocker["id"], {"running"})

    cancelled = await jobs.accepted()
    status, doc = await jobs.call("POST", f"/{cancelled['id']}/cancel")
    assert status == 200
    assert doc["status"] == "cancelled" or doc["cancel_requested"]
    expiring = await jobs.accepted(deadline_s=0.3)
    older = await jobs.accepted(version_key="doc-1", version=1)
    newer = await jobs.accepted(version_key="doc-1", version=2)
    assert (await jobs.get(older["id"]))["status"] == "superseded"

    ids = [blocker, cancelled, expiring, older, newer]
    docs = await jobs.final([job["id"] for job in ids])
    states = [docs[job["id"]]["status"] for job in ids]
    assert states == ["succeeded", "cancelled", "expired", "superseded", "succeeded"]
    assert docs[expiring["id"]]["error"]["code"] == "expired"
    assert docs[older["id"]]["error"]["code"] == "superseded"
    assert (await sim_stats(http, sim))["received"] - received == 2


async def test_polls_and_cancels_answer_while_every_permit_is_held(
    slow_sim, http, stopped, tmp_path
):
    config = gateway_config(slow_sim, sqlite_jobs(tmp_path, workers=4, **PATIENT), pool=1)
    gateway = stopped(config)
    jobs = JobClient(http, gateway, "alice")
    holder = asyncio.create_task(_stream(http, gateway, max_tokens=15))
    await _model_busy(http, slow_sim)
    waiting = [(await jobs.accepted())["id"] for _ in range(8)]

    latencies: list[float] = []
    for i in range(40):
        started = time.perf_counter()
        await jobs.get(waiting[i % 8])
        latencies.append(time.perf_counter() - started)
    for job_id in waiting[:4]:
        started = time.perf_counter()
        status, _ = await jobs.call("DELETE", f"/{job_id}")
        latencies.append(time.perf_counter() - started)
        assert status == 200
    status, listing = await jobs.call("GET", "?limit=8")
    assert (status, {doc["id"] for doc in listing["data"]}) == (200, set(waiting))

    assert not holder.done()
    assert await _pool_active(http, gateway) == 1
    assert (await sim_stats(http, slow_sim))["running"] == 1
    print(
        f"\npolls and cancels under a saturated pool: {len(latencies)} answers, "
        f"p50 {statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
    )
    assert await holder == 200
    docs = await jobs.final(waiting, timeout_s=30)
    assert [docs[job_id]["status"] for job_id in waiting] == ["cancelled"] * 4 + ["succeeded"] * 4


async def test_workers_and_http_requests_share_the_pool_limit(sim, http, stopped, tmp_path):
    async with http.post(f"{sim.url}/sim/reset") as resp:
        assert resp.status == 200
    gateway = stopped(gateway_config(sim, sqlite_jobs(tmp_path, workers=8, **PATIENT), pool=2))
    jobs = JobClient(http, gateway, "alice")
    submitted, answers = await asyncio.gather(
        asyncio.gather(*(jobs.accepted(chat(max_tokens=10)) for _ in range(30))),
        asyncio.gather(*(_post(http, gateway, chat(max_tokens=10)) for _ in range(30))),
    )
    docs = await jobs.final([doc["id"] for doc in submitted], timeout_s=30)
    assert {doc["status"] for doc in docs.values()} == {"succeeded"}
    assert set(answers) <= {200, 503}
    stats = await sim_stats(http, sim)
    assert stats["max_in_flight"] == 2
    assert stats["completed"] == 30 + answers.count(200)


async def test_a_throttled_job_goes_back_for_the_retry_after_and_then_runs(
    sim, http, faults, stopped, tmp_path
):
    """A refusal is not a failure: the job is queued again, due no sooner than the
    provider's Retry-After, and runs once the provider recovers."""
    gateway = stopped(gateway_config(sim, sqlite_jobs(tmp_path)))
    jobs = JobClient(http, gateway, "alice")
    await faults(throttle_rate=1.0, throttle_retry_after_s=2)
    job = await jobs.accepted()
    back = await jobs.wait(job["id"], {"queued"}, with_error=True)
    assert (back["status"], back["last_error"]["code"]) == ("queued", "upstream_throttled")
    assert back["not_before"] - back["updated_at"] >= 2
    await faults(throttle_rate=0.0)
    done = await jobs.wait(job["id"], {"succeeded"})
    assert (done["attempts"], done["last_error"]) == (2, None)


async def test_a_tenant_sees_and_cancels_only_its_own_jobs(sim, http, stopped, tmp_path):
    gateway = stopped(gateway_config(sim, sqlite_jobs(tmp_path)))
    alice, bob = JobClient(http, gateway, "alice"), JobClient(http, gateway, "bob")
    job = await alice.accepted()
    for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/cancel")):
        status, doc = await bob.call(method, f"/{job['id']}{path}")
        assert (status, doc["error"]["code"]) == (404, "not_found")
    status, listing = await bob.call("GET")
    assert (status, listing["data"], listing["has_more"]) == (200, [], False)
    assert (await alice.wait(job["id"], {"succeeded"}))["id"] == job["id"]


@pytest.mark.parametrize(
    ("spec", "status", "code"),
    [
        ({"body": chat(stream=True)}, 400, "invalid_request"),
        ({"endpoint": "/v1/responses"}, 400, "invalid_request"),
        ({"body": chat(model="nope")}, 404, "model_not_found"),
        ({"body": chat(model="private")}, 403, "model_not_allowed"),
        ({"lane": "fast"}, 400, "unknown_lane"),
        ({"deadline_s": -1}, 400, "invalid_request"),
        ({"version": 2}, 400, "invalid_request"),
        ({"deadline": 5}, 400, "invalid_request"),
    ],
)
async def test_a_job_is_checked_as_its_route_would_check_it(
    gateway_with_jobs, http, spec, status, code
):
    bob = JobClient(http, gateway_with_jobs, "bob")
    answer, _, doc = await bob.submit(**spec)
    assert (answer, doc["error"]["code"]) == (status, code)


async def test_a_job_the_upstream_rejects_fails_and_one_without_a_key_is_refused(
    gateway_with_jobs, http
):
    jobs = JobClient(http, gateway_with_jobs, "alice")
    too_long = await jobs.accepted(chat(max_tokens=40_000))
    failed = await jobs.wait(too_long["id"], {"failed"})
    assert (failed["error"]["status"], failed["attempts"]) == (400, 1)
    async with http.get(f"{gateway_with_jobs.url}/v1/jobs") as resp:
        assert resp.status == 401


async def test_a_full_backlog_refuses_new_jobs(sim, http, stopped, tmp_path):
    limits = {"tenant_backlog_max": 2, "backlog_max": 3}
    gateway = stopped(gateway_config(sim, sqlite_jobs(tmp_path, **ONE_AT_A_TIME, **limits)))
    alice, bob = JobClient(http, gateway, "alice"), JobClient(http, gateway, "bob")
    running = await alice.accepted(chat(max_tokens=200))
    await alice.wait(running["id"], {"running"})
    handed_off = await alice.accepted()
    await alice.wait(handed_off["id"], {"running"})
    await alice.accepted()
    await alice.accepted()
    status, headers, doc = await alice.submit()
    assert (status, doc["error"]["code"]) == (429, "job_backlog_full")
    assert "Retry-After" not in headers
    await bob.accepted()
    status, _, doc = await bob.submit()
    assert (status, doc["error"]["code"]) == (503, "job_backlog_full")


async def test_a_job_interrupted_by_shutdown_is_queued_again(slow_sim, http, stopped, tmp_path):
    config = gateway_config(slow_sim, sqlite_jobs(tmp_path))
    gateway = stopped(config)
    jobs = JobClient(http, gateway, "alice")
    job = await jobs.accepted(chat(max_tokens=10))
    await _model_busy(http, slow_sim)
    gateway.stop()
    with sqlite3.connect(tmp_path / "jobs.db") as conn:
        [(state,)] = conn.execute("SELECT state FROM jobs WHERE id = ?", (job["id"],))
    assert state == "queued"
    done = await JobClient(http, stopped(config), "alice").wait(job["id"], {"succeeded"}, 10)
    assert done["attempts"] == 2


@pytest.fixture(scope="module")
def gateway_with_jobs(sim, tmp_path_factory) -> Iterator[Proc]:
    folder = tmp_path_factory.mktemp("jobs-gateway")
    proc = start_gateway(folder, gateway_config(sim, sqlite_jobs(folder)))
    yield proc
    proc.stop()


async def _post(http: aiohttp.ClientSession, gateway: Proc, body: dict) -> int:
    headers = {"Authorization": f"Bearer {KEYS['bob']}"}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def _stream(http: aiohttp.ClientSession, gateway: Proc, max_tokens: int) -> int:
    return await _post(http, gateway, chat(max_tokens=max_tokens, stream=True))


async def _pool_active(http: aiohttp.ClientSession, gateway: Proc) -> float:
    async with http.get(f"{gateway.url}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sluicegate_pool_active_attempts" and sample.labels["pool"] == "p":
                return sample.value
    raise AssertionError("no pool metric")


async def _model_busy(http: aiohttp.ClientSession, sim: Proc) -> None:
    async with asyncio.timeout(5):
        while True:
            if (await sim_stats(http, sim))["running"] >= 1:
                return
            await asyncio.sleep(0.02)


async def test_a_stalled_postgres_answers_503_within_its_timeouts_then_recovers(sim, http, stopped):
    conn = await connect_or_skip()
    proxy = StallingProxy()
    port = proxy.start()
    schema = f"sluicegate_e2e_{uuid.uuid4().hex[:12]}"
    keys = {
        "store": "postgres",
        "postgres_dsn": f"postgresql://postgres@127.0.0.1:{port}/test",
        "postgres_schema": schema,
        "statement_timeout_s": 1.0,
        "store_timeout_s": 1.0,
    }
    try:
        gateway = stopped(gateway_config(sim, keys))
        jobs = JobClient(http, gateway, "alice")
        stored = await jobs.accepted()
        proxy.stall()
        started = time.monotonic()
        for attempt in (jobs.submit(), jobs.call("GET", f"/{stored['id']}")):
            status, *_, doc = await attempt
            assert status == 503, doc
            assert doc["error"]["code"] == "job_store_unavailable"
        assert time.monotonic() - started < 10
        proxy.resume()
        async with asyncio.timeout(15):
            while (await jobs.call("GET", f"/{stored['id']}"))[0] != 200:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    finally:
        proxy.close()
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()
