"""The job store: what the job API, the workers and the batch endpoints need from storage.

Every write is committed (and synced) before its call returns. A tenant sees only its own
jobs, files and batches: asking for another tenant's gets None, as if it did not exist.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from sluicegate.jobs.model import Backlog, Batch, BatchStatus, Job, JobState, StoredFile


class JobStore(Protocol):
    async def submit(self, job: Job) -> Job:
        """Store `job` durably, or return the tenant's job with the same idempotency key.

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
        """Lease up to `limit` due jobs to `owner`: highest priority, then oldest, first.

        Running jobs whose lease ran out are claimed again (at-least-once delivery);
        jobs past their deadline never are.
        """
        ...

    async def heartbeat(self, owner: str, job_id: str, lease_s: float) -> bool:
        """Extend `owner`'s lease; False once the lease is lost or cancel is requested."""
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

    async def create_file(self, file: StoredFile) -> StoredFile: ...

    async def get_file(self, tenant: str, file_id: str) -> StoredFile | None: ...

    async def create_batch(self, batch: Batch, jobs: Sequence[Job]) -> Batch:
        """Store a batch and its jobs in one transaction."""
        ...

    async def get_batch(self, tenant: str, batch_id: str) -> Batch | None: ...

    async def update_batch(self, batch: Batch, expected: BatchStatus) -> bool:
        """Save `batch`'s progress if its stored status is still `expected`.

        The check keeps a worker's write from undoing a concurrent cancel.
        """
        ...

    async def cancel_batch(self, tenant: str, batch_id: str) -> Batch | None:
        """Move an unfinished batch to cancelling and cancel its jobs as `cancel` does."""
        ...

    async def list_batch_jobs(self, tenant: str, batch_id: str) -> list[Job]:
        """Oldest first."""
        ...

    async def close(self) -> None: ...
