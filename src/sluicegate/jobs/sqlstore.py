"""`JobStore` over any SQL `Database`: every rule and statement once, for both dialects.

The database's own locks do the coordination: a write runs in one transaction, claims
skip rows another claimer holds, and a version key's supersession is serialised by a
transaction lock, so several gateway replicas can share one PostgreSQL.
"""

from __future__ import annotations

import itertools
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import replace
from typing import Any

from sluicegate.core.clock import Clock
from sluicegate.jobs import queries as q
from sluicegate.jobs.chunks import chunked
from sluicegate.jobs.model import (
    Backlog,
    Batch,
    BatchStatus,
    Job,
    JobState,
    Purged,
    StoredFile,
)
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
from sluicegate.jobs.store import StorageQuotaExceeded, file_gone

_INSERT_ROWS = 500
"""Jobs per multi-row insert: 22 columns stay well under either driver's parameter limit."""
_PURGES = (q.PURGE_JOBS, q.PURGE_BATCH_JOBS, q.PURGE_BATCHES, q.PURGE_FILES)


class SqlJobStore:
    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock
        self._next_tenant = ""
        """The tenant the last claim served last: the next claim starts after it."""

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

    @property
    def database(self) -> Database:
        """The database, for the records kept beside the jobs (spend)."""
        return self._db

    async def submit(self, job: Job, quota_bytes: int | None = None) -> Job:
        async with self._db.write() as session:
            return await self._submit(session, job, self._clock.now(), quota_bytes)

    async def get(self, tenant: str, job_id: str) -> Job | None:
        return _first_job(await self._read(q.SELECT_JOB, {"tenant": tenant, "id": job_id}))

    async def list_jobs(self, tenant: str, limit: int, after: str | None = None) -> list[Job]:
        query = q.LIST_JOBS if after is None else q.LIST_JOBS_AFTER
        rows = await self._read(query, {"tenant": tenant, "limit": limit, "after": after})
        return [job_from_row(row) for row in rows]

    async def cancel(self, tenant: str, job_id: str) -> Job | None:
        async with self._db.write() as session:
            params = {"tenant": tenant, "id": job_id, "now": self._clock.now()}
            rows = await session.fetch(q.CANCEL_JOB, params)
            return _first_job(rows or await session.fetch(q.SELECT_JOB, params))

    async def claim(
        self, owner: str, lease_s: float, limit: int, lanes: Collection[str] | None = None
    ) -> list[Job]:
        lane_filter, params = ("1 = 1", {}) if lanes is None else in_list("lane", lanes)
        async with self._db.write() as session:
            now = self._clock.now()
            params |= {"owner": owner, "until": now + lease_s, "now": now, "limit": limit}
            await session.fetch(q.CANCEL_ABANDONED, params)
            order = await self._pick(session, q.pick(lane_filter), params)
            if not order:
                return []
            id_filter, ids = in_list("id", order)
            rows = await session.fetch(q.claim(id_filter), params | ids)
        return sorted(map(job_from_row, rows), key=lambda j: order[j.id])

    async def _pick(self, session: Session, pick: str, params: Row) -> dict[str, int]:
        """Up to `limit` due ids, each tenant's in priority order, taken a turn per tenant:
        one tenant's backlog or top priority never starves another. Tenants are visited
        from where the last claim left off, so each claim starts with a different one."""
        limit = params["limit"]
        tenants = await self._tenants_from(session, self._next_tenant, limit)
        queues = [
            [row["id"] for row in await session.fetch(pick, params | {"tenant": tenant})]
            for tenant in tenants
        ]
        order: dict[str, int] = {}
        for turn in range(limit):
            for tenant, queue in zip(tenants, queues, strict=True):
                if turn < len(queue) and len(order) < limit:
                    order[queue[turn]] = len(order)
                    self._next_tenant = tenant
        return order

    @staticmethod
    async def _tenants_from(session: Session, start: str, limit: int) -> list[str]:
        """Up to `limit` tenants with live jobs, in name order from after `start`, wrapping."""
        tenants: list[str] = []
        after, wrapped = start, False
        while len(tenants) < limit:
            [row] = await session.fetch(q.NEXT_TENANT, {"after": after})
            tenant = row["tenant"]
            if tenant is None or (wrapped and tenant > start):
                if wrapped or not start:
                    break
                after, wrapped = "", True
                continue
            tenants.append(tenant)
            after = tenant
        return tenants

    async def heartbeat(self, owner: str, job_id: str, lease_s: float) -> bool:
        def params(now: float) -> Row:
            return {"owner": owner, "id": job_id, "until": now + lease_s, "now": now}

        return bool(await self._stamped(q.HEARTBEAT, params))

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
        values = {
            "owner": owner,
            "id": job_id,
            "state": state.value,
            "result": result,
            "error": json_text(error),
        }
        async with self._db.write() as session:
            rows = await session.fetch(q.FINISH, values | {"now": self._clock.now()})
            if rows and result:
                await _charge(session, rows[0]["tenant"], len(result))
        return bool(rows)

    async def release(
        self, owner: str, job_id: str, delay_s: float, error: dict[str, Any] | None = None
    ) -> bool:
        def params(now: float) -> Row:
            return {
                "owner": owner,
                "id": job_id,
                "not_before": now + delay_s,
                "error": json_text(error),
                "now": now,
            }

        return bool(await self._stamped(q.RELEASE, params))

    async def expire_due(self) -> int:
        return len(await self._stamped(q.EXPIRE, lambda now: {"now": now}))

    async def backlog(self, tenant: str | None = None, lane: str | None = None) -> Backlog:
        filters = {name: v for name, v in (("tenant", tenant), ("lane", lane)) if v is not None}
        [row] = await self._read(q.backlog(filters), filters)
        now = self._clock.now()
        return Backlog(row["n"], 0.0 if row["oldest"] is None else now - row["oldest"])

    async def counts_by_state(self) -> dict[JobState, int]:
        rows = await self._read(q.COUNT_STATES, {})
        return dict.fromkeys(JobState, 0) | {JobState(row["state"]): row["n"] for row in rows}

    async def create_file(
        self, file: StoredFile, content: AsyncIterable[bytes], quota_bytes: int | None = None
    ) -> StoredFile:
        """The row first, without a size (hidden), then a chunk per transaction, so claims
        and heartbeats interleave with a long write; then the size, which shows it."""
        await self._write(q.INSERT_FILE, file_row(replace(file, created_at=self._clock.now())))
        seq = size = 0
        async for chunk in chunked(content):
            await self._add_chunk(file.id, seq, chunk)
            seq, size = seq + 1, size + len(chunk)
        return await self._show_file(file, size, quota_bytes)

    async def _add_chunk(self, file_id: str, seq: int, data: bytes) -> None:
        async with self._db.write() as session:
            if not await session.fetch(q.HOLD_PARTIAL_FILE, {"id": file_id}):
                raise file_gone(file_id)
            await session.fetch(q.INSERT_CHUNK, {"id": file_id, "seq": seq, "data": data})

    async def _show_file(self, file: StoredFile, size: int, quota_bytes: int | None) -> StoredFile:
        """Counted and shown in one transaction: only whole files count. A refused file
        is dropped in that transaction; one gone meanwhile undoes its count."""
        refusal: StorageQuotaExceeded | None = None
        async with self._db.write() as session:
            now = self._clock.now()
            params = {"id": file.id, "size": size, "now": now}
            try:
                await _charge(session, file.tenant, size, quota_bytes)
            except StorageQuotaExceeded as err:
                refusal = err
                await session.fetch(q.DROP_PARTIAL_FILE, params)
            else:
                if not await session.fetch(q.SHOW_FILE, params):
                    raise file_gone(file.id)
        if refusal is not None:
            raise refusal
        return replace(file, size=size, created_at=now)

    async def get_file(self, tenant: str, file_id: str) -> StoredFile | None:
        rows = await self._read(q.SELECT_FILE, {"tenant": tenant, "id": file_id})
        return file_from_row(rows[0]) if rows else None

    async def read_file(self, file: StoredFile) -> AsyncIterator[bytes]:
        """No session is held between chunks, however slowly they are consumed."""
        params = {"tenant": file.tenant, "id": file.id}
        seq = read = 0
        while read < file.size:
            rows = await self._read(q.SELECT_CHUNK, params | {"seq": seq})
            if not rows:
                raise file_gone(file.id)
            chunk = rows[0]["data"]
            yield chunk
            seq, read = seq + 1, read + len(chunk)

    async def list_files(
        self, tenant: str, limit: int, after: str | None = None
    ) -> list[StoredFile]:
        query = q.LIST_FILES if after is None else q.LIST_FILES_AFTER
        rows = await self._read(query, {"tenant": tenant, "limit": limit, "after": after})
        return [file_from_row(row) for row in rows]

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        return bool(await self._delete(q.DELETE_FILE, {"tenant": tenant, "id": file_id}))

    async def create_batch(
        self, batch: Batch, jobs: Iterable[Job], quota_bytes: int | None = None
    ) -> Batch:
        """The bodies are counted as they are inserted and charged at the end: a batch
        past the quota rolls back whole."""
        async with self._db.write() as session:
            now = self._clock.now()
            status_at = batch.status_at | {batch.status.value: now}
            stored = replace(batch, status_at=status_at, created_at=now, updated_at=now)
            await session.fetch(q.INSERT_BATCH, batch_row(stored))
            stamp = {"tenant": batch.tenant, "batch_id": batch.id, "created_at": now}
            stamp["updated_at"] = now
            size = 0
            for chunk in _chunks(jobs, _INSERT_ROWS):
                rows = [job_row(job) | stamp for job in chunk]
                size += sum(len(job.body) for job in chunk)
                await session.fetch(q.insert_jobs(len(rows)), _numbered(rows))
            await _charge(session, batch.tenant, size, quota_bytes)
        return stored

    async def get_batch(self, tenant: str, batch_id: str) -> Batch | None:
        return _first_batch(await self._read(q.SELECT_BATCH, {"tenant": tenant, "id": batch_id}))

    async def list_batches(self, tenant: str, limit: int, after: str | None = None) -> list[Batch]:
        query = q.LIST_BATCHES if after is None else q.LIST_BATCHES_AFTER
        rows = await self._read(query, {"tenant": tenant, "limit": limit, "after": after})
        return [batch_from_row(row) for row in rows]

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

    async def batch_live(self, batch_id: str) -> bool:
        return bool(await self._read(q.BATCH_LIVE, {"batch_id": batch_id}))

    async def batch_counts(self, batch_id: str) -> dict[JobState, int]:
        rows = await self._read(q.BATCH_COUNTS, {"batch_id": batch_id})
        return dict.fromkeys(JobState, 0) | {JobState(row["state"]): row["n"] for row in rows}

    async def list_batch_jobs(
        self, tenant: str, batch_id: str, state: JobState, limit: int, after: str | None = None
    ) -> list[Job]:
        query = q.LIST_BATCH_JOBS if after is None else q.LIST_BATCH_JOBS_AFTER
        params = {"tenant": tenant, "batch_id": batch_id, "state": state.value}
        params |= {"limit": limit, "after": after}
        return [job_from_row(row) for row in await self._read(query, params)]

    async def purge(self, before: float, limit: int) -> Purged:
        """Each statement in its own short transaction, deleting at most `limit` rows."""
        params = {"before": before, "limit": limit}
        counts = [await self._delete(query, params) for query in _PURGES]
        return Purged(counts[0] + counts[1], counts[2], counts[3])

    async def _delete(self, query: str, params: Row) -> int:
        """Run a delete answering each row's `tenant` and bytes `n`, and give those bytes
        back to their tenants in its transaction; how many rows it deleted."""
        async with self._db.write() as session:
            rows = await session.fetch(query, params)
            freed: dict[str, int] = {}
            for row in rows:
                freed[row["tenant"]] = freed.get(row["tenant"], 0) + row["n"]
            for tenant, size in freed.items():
                await _charge(session, tenant, -size)
        return len(rows)

    async def _submit(self, session: Session, job: Job, now: float, quota: int | None) -> Job:
        """The job as stored: `job`, or the one its idempotency key or id already names
        (then nothing more is counted)."""
        row = job_row(replace(job, created_at=now, updated_at=now))
        if await session.fetch(q.INSERT_JOB, row):
            await _charge(session, job.tenant, len(job.body), quota)
            if job.version_key is not None:
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

    async def _stamped(self, query: str, params: Callable[[float], Row]) -> list[Row]:
        """One write whose times are read once its transaction holds the database, so a
        wait for the lock never makes a lease or a deadline look later than it is."""
        async with self._db.write() as session:
            return await session.fetch(query, params(self._clock.now()))

    async def _read(self, query: str, params: Mapping[str, Any]) -> list[Row]:
        async with self._db.read() as session:
            return await session.fetch(query, params)

    async def _write(self, query: str, params: Mapping[str, Any]) -> list[Row]:
        async with self._db.write() as session:
            return await session.fetch(query, params)


async def _charge(session: Session, tenant: str, size: int, quota_bytes: int | None = None) -> None:
    """Count `size` bytes (negative: given back) against `tenant`'s stored bytes, in the
    caller's transaction; past `quota_bytes`, `StorageQuotaExceeded` and nothing counted."""
    if size == 0:
        return
    params = {"tenant": tenant, "n": size}
    await session.fetch(q.OPEN_TENANT_BYTES, params)
    if quota_bytes is None or size < 0:
        await session.fetch(q.ADD_BYTES, params)
    elif not await session.fetch(q.CHARGE_BYTES, params | {"quota": quota_bytes}):
        [row] = await session.fetch(q.TENANT_BYTES, params)
        raise StorageQuotaExceeded(tenant, row["bytes"], quota_bytes)


def _chunks(items: Iterable[Job], size: int) -> Iterator[list[Job]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _numbered(rows: list[Row]) -> Row:
    """Rows of a multi-row insert as one parameter map, row i's names suffixed `_i`."""
    return {f"{name}_{i}": value for i, row in enumerate(rows) for name, value in row.items()}


def _first_job(rows: list[Row]) -> Job | None:
    return job_from_row(rows[0]) if rows else None


def _first_batch(rows: list[Row]) -> Batch | None:
    return batch_from_row(rows[0]) if rows else None
