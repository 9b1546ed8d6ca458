"""The job store: what the job API, the workers and the batch endpoints need from storage.

Every write is committed (and synced) before its call returns. A tenant sees only its own
jobs, files and batches: asking for another tenant's gets None, as if it did not exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Collection, Iterable
from typing import Any, Protocol

from sluicegate.core.errors import ErrorType, GatewayError, not_found
from sluicegate.jobs.model import (
    Backlog,
    Batch,
    BatchStatus,
    Job,
    JobState,
    Purged,
    StoredFile,
)

UNAVAILABLE = "job_store_unavailable"


class JobStoreUnavailable(GatewayError):
    """The database did not answer in time or dropped the connection: a 503 to retry,
    never a 500, with no Retry-After (no end of the outage is known). Raised by the
    databases, which alone know their drivers' errors."""

    def __init__(self, cause: BaseException | str) -> None:
        reason = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(
            503,
            UNAVAILABLE,
            f"the job store is unavailable ({reason}); try again shortly",
            ErrorType.UNAVAILABLE,
        )


class StorageQuotaExceeded(GatewayError):
    """Every byte a tenant keeps counts: whole files, job bodies (a batch's too) and job
    results, until deleted or retired."""

    def __init__(self, tenant: str, used: int, quota: int) -> None:
        super().__init__(
            429,
            "storage_quota_exceeded",
            f"tenant {tenant} stores {used} bytes of files, jobs and results; its quota is "
            f"{quota}: delete files (DELETE /v1/files/{{id}}) or wait for retention to "
            "remove what ended",
            ErrorType.RATE_LIMIT,
            should_retry=False,
        )
        self.used = used


def file_gone(file_id: str) -> GatewayError:
    return not_found(f"file {file_id!r} was deleted while it was read or written")


class JobStore(Protocol):
    """`quota_bytes` bounds what a tenant stores (None: counted, never refused): a write
    that would pass it raises `StorageQuotaExceeded` and keeps nothing. Results and result
    files are written without one, since they hold work already done."""

    async def submit(self, job: Job, quota_bytes: int | None = None) -> Job:
        """Store `job` durably, or return the tenant's job with the same idempotency key
        (which counts nothing more).

        A stored job with a `version_key` supersedes, in the same transaction, every
        unfinished job of the tenant with that key and a lower version; a job older than
        one already stored is stored superseded.
        """
        ...

    async def get(self, tenant: str, job_id: str) -> Job | None: ...

    async def list_jobs(self, tenant: str, limit: int, after: str | None = None) -> list[Job]:
        """Newest first; `after` is the last job id of the previous page (unknown: no jobs)."""
        ...

    async def cancel(self, tenant: str, job_id: str) -> Job | None:
        """Cancel a queued job at once; flag a running one for its worker to stop."""
        ...

    async def claim(
        self, owner: str, lease_s: float, limit: int, lanes: Collection[str] | None = None
    ) -> list[Job]:
        """Lease up to `limit` due jobs to `owner`, a turn per tenant in rotation; within
        a tenant, highest priority, then oldest, first.

        Running jobs whose lease ran out are claimed again (at-least-once delivery), but
        never by the owner that still holds them; jobs past their deadline never are.
        """
        ...

    async def heartbeat(self, owner: str, job_id: str, lease_s: float) -> bool:
        """Extend `owner`'s lease; False once the lease is lost, has lapsed (even if no one
        else claimed the job yet) or cancel is requested."""
        ...

    async def finish(
        self,
        owner: str,
        job_id: str,
        state: JobState,
        result: bytes | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """Give a job held by `owner` its final `state`; False if `owner` no longer holds it."""
        ...

    async def release(
        self, owner: str, job_id: str, delay_s: float, error: dict[str, Any] | None = None
    ) -> bool:
        """Queue a job held by `owner` again, due in `delay_s`, keeping its attempts.

        A job whose cancel was requested is cancelled instead.
        """
        ...

    async def expire_due(self) -> int:
        """Give every unfinished job past its deadline the state expired; how many did."""
        ...

    async def backlog(self, tenant: str | None = None, lane: str | None = None) -> Backlog: ...

    async def counts_by_state(self) -> dict[JobState, int]: ...

    async def create_file(
        self, file: StoredFile, content: AsyncIterable[bytes], quota_bytes: int | None = None
    ) -> StoredFile:
        """Store `file` with `content`, taken in pieces of any size as they come and
        stored a chunk per transaction, so the store holds no more than a chunk of it.

        The file is shown (to `get_file`, `list_files`, `delete_file` and the quota) only
        once whole, in one transaction; one left partial (its writer failed) stays hidden
        until retention removes it. `StorageQuotaExceeded`, and nothing kept, if the
        tenant's files would then pass `quota_bytes`.
        """
        ...

    async def get_file(self, tenant: str, file_id: str) -> StoredFile | None: ...

    def read_file(self, file: StoredFile) -> AsyncIterator[bytes]:
        """The content of `file` (as `get_file` returned it), a chunk per read; a 404
        (`file_gone`) if it is deleted before the last chunk is read."""
        ...

    async def list_files(
        self, tenant: str, limit: int, after: str | None = None
    ) -> list[StoredFile]:
        """Newest first; `after` as in `list_jobs`."""
        ...

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        """Delete a whole file and its chunks."""
        ...

    async def create_batch(
        self, batch: Batch, jobs: Iterable[Job], quota_bytes: int | None = None
    ) -> Batch:
        """Store a batch and its jobs (fresh ones, keyless) in one transaction; their
        bodies count, beside the input file they were read from."""
        ...

    async def get_batch(self, tenant: str, batch_id: str) -> Batch | None: ...

    async def list_batches(self, tenant: str, limit: int, after: str | None = None) -> list[Batch]:
        """Newest first; `after` as in `list_jobs`."""
        ...

    async def update_batch(self, batch: Batch, expected: BatchStatus) -> bool:
        """Save `batch`'s progress if its stored status is still `expected`.

        The check keeps a worker's write from undoing a concurrent cancel.
        """
        ...

    async def cancel_batch(self, tenant: str, batch_id: str) -> Batch | None:
        """Move an unfinished batch to cancelling and cancel its jobs as `cancel` does."""
        ...

    async def batch_live(self, batch_id: str) -> bool:
        """Whether a job of the batch is still queued or running; reads one index entry."""
        ...

    async def batch_counts(self, batch_id: str) -> dict[JobState, int]:
        """The batch's jobs by state, counted in the database: no job row is read."""
        ...

    async def list_batch_jobs(
        self, tenant: str, batch_id: str, state: JobState, limit: int, after: str | None = None
    ) -> list[Job]:
        """The batch's jobs in `state`, oldest first, a page at a time; `after` is the last
        job id of the previous page."""
        ...

    async def purge(self, before: float, limit: int) -> Purged:
        """Delete, up to `limit` rows a statement, finished jobs, final batches and their
        jobs, and files (with their chunks), last changed before `before`; call again
        while one is full."""
        ...

    async def close(self) -> None: ...
