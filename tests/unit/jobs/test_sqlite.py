from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from sluicegate.core.types import Endpoint
from sluicegate.jobs.model import Job
from sluicegate.jobs.schema import MIGRATIONS, migrate
from sluicegate.jobs.sqlite import connect_sqlite, open_sqlite
from sluicegate.jobs.sqlstore import SqlJobStore
from sluicegate.jobs.store import JobStoreUnavailable
from tests.support.clock import FakeClock

ROOT = Path(__file__).parents[3]

SUBMIT_200_THEN_DIE = """
import asyncio, os, signal, sys
from sluicegate.core.types import Endpoint
from sluicegate.jobs.model import Job
from sluicegate.jobs.sqlite import open_sqlite

async def main(path):
    store = await open_sqlite(path)
    for _ in range(200):
        job = await store.submit(Job(tenant="t", kind=Endpoint.CHAT, body=b"{}", lane="batch"))
        print(job.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main(sys.argv[1]))
"""


async def test_the_live_connection_uses_wal_and_syncs_every_commit(tmp_path):
    db = await connect_sqlite(tmp_path / "jobs.db")
    store = await SqlJobStore.open(db, FakeClock())
    try:
        async with db.read() as session:
            assert await session.fetch("PRAGMA journal_mode") == [{"journal_mode": "wal"}]
            assert await session.fetch("PRAGMA synchronous") == [{"synchronous": 2}]  # FULL
    finally:
        await store.close()


async def test_migrations_are_recorded_and_applied_once(tmp_path):
    db = await connect_sqlite(tmp_path / "jobs.db")
    store = await SqlJobStore.open(db, FakeClock())
    try:
        assert await migrate(db, 0.0) == []
        async with db.read() as session:
            rows = await session.fetch("SELECT version FROM schema_migrations")
        assert [row["version"] for row in rows] == [m.version for m in MIGRATIONS]
    finally:
        await store.close()


async def test_every_acknowledged_submit_survives_sigkill(tmp_path):
    path = tmp_path / "jobs.db"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SUBMIT_200_THEN_DIE,
        str(path),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, _ = await child.communicate()
    assert child.returncode == -signal.SIGKILL
    acknowledged = out.decode().split()
    assert len(acknowledged) == 200

    store = await open_sqlite(path)
    try:
        stored = await store.list_jobs("t", 1000)
    finally:
        await store.close()
    assert {job.id for job in stored} == set(acknowledged)


async def test_a_write_reads_the_clock_once_it_holds_the_database(tmp_path):
    """A heartbeat that waited for the connection must not grant a lease from before it."""
    clock = FakeClock(1_000.0)
    store = await open_sqlite(tmp_path / "jobs.db", clock)
    try:
        held = await store.submit(Job(tenant="t", kind=Endpoint.CHAT, body=b"{}", lane="batch"))
        await store.claim("w", 10, 1)
        async with store._db.write():
            beat = asyncio.ensure_future(store.heartbeat("w", held.id, 10))
            await asyncio.sleep(0.01)
            clock.advance(5)
        assert await beat
        assert (await store.get("t", held.id)).lease_until == clock.now() + 10
    finally:
        await store.close()


async def test_a_session_waits_for_the_connection_only_as_long_as_its_bound(tmp_path):
    store = await open_sqlite(tmp_path / "jobs.db", FakeClock(), timeout_s=0.05)
    try:
        async with store._db.write():
            with pytest.raises(JobStoreUnavailable) as raised:
                await store.get("t", "job_x")
        assert (raised.value.status, raised.value.code) == (503, "job_store_unavailable")
    finally:
        await store.close()
