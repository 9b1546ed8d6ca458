"""`JobStore` over any SQL `Database`: every rule and statement once, for both dialects.

The database's own locks do the coordination: a write runs in one transaction, claims
skip rows another claimer holds, and a version key's supersession is serialised by a
transaction lock, so several gateway replicas can share one PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sluicegate.core.clock import Clock
from sluicegate.jobs import queries as q
from sluicegate.jobs.model import Backlog, Batch, BatchStatus, Job, JobState, StoredFile
from sluicegate.jobs.rows import (
    batch_from_row,
    batch_row,
    file_from_row,
    file_row,
    job_from_row,
    job_row,
    json_text,
)
from sluicegate.jobs.schema import migrate
from sluicegate.jobs.sql import Database, Row, Session, in_list


class SqlJobStore:
    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    @classmethod
    async def open(cls, db: Database, clock: Clock, setup: Sequence[str] = ()) -> SqlJobStore:
        """Migrate `db` (running `setup` first) and wrap it; `db` is closed if that fails."""
        try:
            await migrate(db, clock.now(), setup)
        except BaseException:
            await db.close()
            raise
        return cls(db, clock)

    async def close(self) -> None:
        await self._db.close()

    async def submit(self, job: Job) -> Job:
        async with self._db.write() as session:
            return await self._submit(session, job, self._clock.now())

    async def get(self, tenant: str, job_id: str) -> Job | None:
        return _first_job(await self._read(q.SELECT_JOB, {"tenant": tenant, "id": job_id}))

    async def list_jobs(self, tenant: str, limit: int, after: str | None = None) -> list[Job]:
        query = q.LIST_JOBS if after is None else q.LIST_JOBS_AFTER
        rows = await self._read(query, {"tenant": tenant, "limit": limit, "after": after})
        return [job_from_row(row) for row in rows]

    async def cancel(self, tenant: str, job_id: str) -> Job | None:
        params = {"tenant": tenant, "id": job_id, "now": self._clock.now()}
        async with self._db.write() as session:
            rows = await session.fetch(q.CANCEL_JOB, params)
            return _first_job(rows or await session.fetch(q.SELECT_JOB, params))

    async def claim(
        self, owner: str, lease_s: float, limit: int, lanes: Collection[str] | None = None
    ) -> list[Job]:
        lane_filter, params = ("1 = 1", {}) if lanes is None else in_list("lane", lanes)
        now = self._clock.now()
        params |= {"owner": owner, "until": now + lease_s, "now": now, "limit": limit}
        async with self._db.write() as session:
            await session.fetch(q.CANCEL_ABANDONED, params)
            picked = await session.fetch(q.pick(lane_filter), params)
            if not picked:
                return []
            id_filter, ids = in_list("id", [row["id"] for row in picked])
            rows = await session.fetch(q.claim(id_filter), params | ids)
        return sorted(map(job_from_row, rows), key=lambda j: (-j.priority, j.created_at, j.id))

    async def heartbeat(self, owner: str, job_id: str, lease_s: float) -> bool:
        until = self._clock.now() + lease_s
        return bool(await self._write(q.HEARTBEAT, {"owner": owner, "id": job_id, "until": until}))

    async def finish(
        self,
        owner: str,
        job_id: str,
        state: JobState,
        result: bytes | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        if not state.final:
            raise ValueError(f"a job cannot finish as {state.value}")
        params = {
            "owner": owner,
            "id": job_id,
            "state": state.value,
            "result": result,
            "error": json_text(error),
            "now": self._clock.now(),
        }
        return bool(await self._write(q.FINISH, params))

    async def release(
        self, owner: str, job_id: str, delay_s: float, error: dict[str, Any] | None = None
    ) -> bool:
        now = self._clock.now()
        params = {
            "owner": owner,
            "id": job_id,
            "not_before": now + delay_s,
            "error": json_text(error),
            "now": now,
        }
        return bool(await self._write(q.RELEASE, params))

    async def expire_due(self) -> int:
        return len(await self._write(q.EXPIRE, {"now": self._clock.now()}))

    async def backlog(self, tenant: str | None = None, lane: str | None = None) -> Backlog:
        filters = {name: v for name, v in (("tenant", tenant), ("lane", lane)) if v is not None}
        now = self._clock.now()
        [row] = await self._read(q.backlog(filters), filters)
        return Backlog(row["n"], 0.0 if row["oldest"] is None else now - row["oldest"])

    async def counts_by_state(self) -> dict[JobState, int]:
        rows = await self._read(q.COUNT_STATES, {})
        return dict.fromkeys(JobState, 0) | {JobState(row["state"]): row["n"] for row in rows}

    async def create_file(self, file: StoredFile) -> StoredFile:
        stored = replace(file, created_at=self._clock.now())
        await self._write(q.INSERT_FILE, file_row(stored))
        return stored

    async def get_file(self, tenant: str, file_id: str) -> StoredFile | None:
        rows = await self._read(q.SELECT_FILE, {"tenant": tenant, "id": file_id})
        return file_from_row(rows[0]) if rows else None

    async def create_batch(self, batch: Batch, jobs: Sequence[Job]) -> Batch:
        now = self._clock.now()
        status_at = batch.status_at | {batch.status.value: now}
        stored = replace(batch, status_at=status_at, created_at=now, updated_at=now)
        async with self._db.write() as session:
            await session.fetch(q.INSERT_BATCH, batch_row(stored))
            for job in jobs:
                member = replace(job, tenant=batch.tenant, batch_id=batch.id)
                await self._submit(session, member, now)
        return stored

    async def get_batch(self, tenant: str, batch_id: str) -> Batch | None:
        return _first_batch(await self._read(q.SELECT_BATCH, {"tenant": tenant, "id": batch_id}))

    async def update_batch(self, batch: Batch, expected: BatchStatus) -> bool:
        async with self._db.write() as session:
            return await self._update_batch(session, batch, expected) is not None

    async def cancel_batch(self, tenant: str, batch_id: str) -> Batch | None:
        params = {"tenant": tenant, "id": batch_id, "batch_id": batch_id}
        async with self._db.write() as session:
            batch = _first_batch(await session.fetch(q.SELECT_BATCH_FOR_UPDATE, params))
            if batch is None or batch.status.final or batch.status is BatchStatus.CANCELLING:
                return batch
            cancelling = replace(batch, status=BatchStatus.CANCELLING)
            stored = await self._update_batch(session, cancelling, batch.status)
            await session.fetch(q.CANCEL_BATCH_JOBS, params | {"now": self._clock.now()})
            return stored

    async def list_batch_jobs(self, tenant: str, batch_id: str) -> list[Job]:
        rows = await self._read(q.LIST_BATCH_JOBS, {"tenant": tenant, "batch_id": batch_id})
        return [job_from_row(row) for row in rows]

    async def _submit(self, session: Session, job: Job, now: float) -> Job:
        """The job as stored: `job`, or the one its idempotency key or id already names."""
        row = job_row(replace(job, created_at=now, updated_at=now))
        if await session.fetch(q.INSERT_JOB, row) and job.version_key is not None:
            await session.lock(f"version\n{job.tenant}\n{job.version_key}")
            await session.fetch(q.SUPERSEDE, row | {"now": now})
        stored = _first_job(await session.fetch(q.SELECT_EXISTING, row))
        if stored is None:
            raise ValueError(f"job id {job.id} is taken by another tenant")
        return stored

    async def _update_batch(
        self, session: Session, batch: Batch, expected: BatchStatus
    ) -> Batch | None:
        """`batch` as stored, with the time it entered a new status; None if `expected` was not."""
        now = self._clock.now()
        stored = replace(batch, updated_at=now)
        if batch.status is not expected:
            stored = replace(stored, status_at=batch.status_at | {batch.status.value: now})
        rows = await session.fetch(q.UPDATE_BATCH, batch_row(stored) | {"expected": expected.value})
        return stored if rows else None

    async def _read(self, query: str, params: Mapping[str, Any]) -> list[Row]:
        async with self._db.read() as session:
            return await session.fetch(query, params)

    async def _write(self, query: str, params: Mapping[str, Any]) -> list[Row]:
        async with self._db.write() as session:
            return await session.fetch(query, params)


def _first_job(rows: list[Row]) -> Job | None:
    return job_from_row(rows[0]) if rows else None


def _first_batch(rows: list[Row]) -> Batch | None:
    return batch_from_row(rows[0]) if rows else None
