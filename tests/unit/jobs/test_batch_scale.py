"""Batch settlement and polling cost rows in proportion to the batch, read once.

Rows are counted as the database hands them back (RETURNING rows too), through a
counting wrapper of the store's own `Database` protocol around a real SQLite file.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

from sluicegate.api.batches import read_requests
from sluicegate.api.intake import Intake
from sluicegate.api.ledger import BatchLedger
from sluicegate.core.types import Endpoint, JobPolicy
from sluicegate.jobs.model import Batch, BatchStatus, Job, JobState
from sluicegate.jobs.sql import Database, Row, Session
from sluicegate.jobs.sqlite import connect_sqlite
from sluicegate.jobs.sqlstore import SqlJobStore
from tests.config.test_config import base, parse
from tests.support.clock import FakeClock


@dataclass
class Tally:
    rows: int = 0
    columns: set[str] = field(default_factory=set)


class CountingSession:
    def __init__(self, inner: Session, tally: Tally) -> None:
        self._inner, self._tally = inner, tally

    async def fetch(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        rows = await self._inner.fetch(query, params)
        self._tally.rows += len(rows)
        for row in rows:
            self._tally.columns |= row.keys()
        return rows

    async def lock(self, key: str) -> None:
        await self._inner.lock(key)


class CountingDatabase:
    def __init__(self, inner: Database) -> None:
        self._inner = inner
        self.dialect = inner.dialect
        self.tally = Tally()

    def reset(self) -> Tally:
        tally, self.tally = self.tally, Tally()
        return tally

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Session]:
        async with self._inner.read() as session:
            yield CountingSession(session, self.tally)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Session]:
        async with self._inner.write() as session:
            yield CountingSession(session, self.tally)

    async def close(self) -> None:
        await self._inner.close()


@dataclass
class Costs:
    poll: Tally
    job_end: Tally
    last_job_end: Tally


async def running_batch(store: SqlJobStore, lines: int) -> Batch:
    """A batch of `lines` queued chat jobs, stored."""
    batch = Batch(
        tenant="alice",
        input_file_id="file-x",
        endpoint=Endpoint.CHAT.path,
        completion_window="24h",
        status=BatchStatus.IN_PROGRESS,
        total_requests=lines,
    )
    body = b'{"model": "chat", "messages": []}'
    members = (
        Job(tenant="alice", kind=Endpoint.CHAT, body=body, lane="batch", custom_id=f"r{i}")
        for i in range(lines)
    )
    return await store.create_batch(batch, members)


async def costs(tmp_path, lines: int) -> Costs:
    """Rows fetched by a poll and a job's end while one job is left, then by the last end."""
    clock = FakeClock(1_700_000_000.0)
    db = CountingDatabase(await connect_sqlite(tmp_path / f"jobs-{lines}.db"))
    store = await SqlJobStore.open(db, clock)
    try:
        intake = SimpleNamespace(store=store, clock=clock, policy=JobPolicy())
        ledger = BatchLedger(cast(Intake, intake))
        batch = await running_batch(store, lines)
        claimed = await store.claim("w", 600, lines)
        async with db.write() as session:
            await session.fetch(
                "UPDATE jobs SET state = 'succeeded', result = :result WHERE id <> :last",
                {"result": b'{"id": "answer"}', "last": claimed[-1].id},
            )
        db.reset()
        await ledger.settle("alice", batch.id)
        poll = db.reset()
        await ledger.job_finished(store, claimed[0])
        job_end = db.reset()
        await store.finish("w", claimed[-1].id, JobState.SUCCEEDED, result=b"{}")
        await ledger.job_finished(store, claimed[-1])
        last_job_end = db.reset()
        settled = await store.get_batch("alice", batch.id)
        assert settled.status is BatchStatus.COMPLETED
        assert settled.completed_requests == lines
        output = await store.get_file("alice", settled.output_file_id)
        content = b"".join([chunk async for chunk in store.read_file(output)])
        assert content.count(b"\n") == lines
        return Costs(poll, job_end, last_job_end)
    finally:
        await store.close()


async def test_polls_and_job_ends_read_no_job_and_settling_reads_each_once(tmp_path):
    small, large = await costs(tmp_path, 1_000), await costs(tmp_path, 10_000)
    for cost in (small, large):
        assert cost.poll.rows <= 10
        assert "result" not in cost.poll.columns
        assert cost.job_end.rows <= 2
        assert "result" not in cost.job_end.columns
        assert "result" in cost.last_job_end.columns
    assert (small.poll.rows, small.job_end.rows) == (large.poll.rows, large.job_end.rows)
    assert 1_000 <= small.last_job_end.rows <= 1_100
    assert 10_000 <= large.last_job_end.rows <= 10_100


def test_checking_a_batchs_input_holds_about_one_copy_of_its_requests():
    settings = parse(base())
    intake = Intake(settings, FakeClock(), lambda: None)
    line = b'{"custom_id": "r%d", "method": "POST", "url": "/v1/chat/completions", '
    body = b'"body": {"model": "chat", "messages": [{"role": "user", "content": "q"}]}}\n'
    content = b"".join(line % i + body for i in range(20_000))
    tracemalloc.start()
    try:
        requests = read_requests(intake, settings.tenants[0], Endpoint.CHAT, [content])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(requests) == 20_000
    assert peak < 2 * len(content)


def test_an_input_read_in_chunks_of_any_size_gives_the_same_requests_and_errors():
    """A line may span chunks (the store's are 1 MiB; lines are any length)."""
    settings = parse(base())
    intake = Intake(settings, FakeClock(), lambda: None)
    line = b'{"custom_id": "r%d", "method": "POST", "url": "/v1/chat/completions", '
    body = b'"body": {"model": "chat", "messages": [{"role": "user", "content": "q"}]}}'
    content = b"\n".join(line % i + body for i in range(40)) + b"\n\n  \nnot json"
    whole = read_requests(intake, settings.tenants[0], Endpoint.CHAT, [content])
    assert [error["line"] for error in whole] == [43]
    for size in (1, 7, 130, len(content) - 1):
        chunks = [content[i : i + size] for i in range(0, len(content), size)]
        assert read_requests(intake, settings.tenants[0], Endpoint.CHAT, chunks) == whole
    valid = content[: content.index(b"\n\n") + 1]
    requests = read_requests(intake, settings.tenants[0], Endpoint.CHAT, [valid[:150], valid[150:]])
    assert list(requests) == [f"r{i}" for i in range(40)]
