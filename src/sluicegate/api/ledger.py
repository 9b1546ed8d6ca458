"""Batches kept up to date with their jobs: counts while they run, then result files.

Nothing watches a batch: it is settled when its last job ends here and whenever it is
read, so a batch whose last job ended elsewhere (another replica, the expiry sweep, a
cancel) is finished by its next poll. Status changes are compare-and-set, so a cancel is
never undone and only one settler writes the result files; a settler that died after
`finalizing` is replaced once the batch has been finalizing for a lease.

A result file is written as its jobs are read, a page at a time, into the store's chunks:
finishing a batch holds a page of results and a chunk, whatever the batch's size.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import orjson

from sluicegate.api.intake import Intake
from sluicegate.api.jobs import job_error
from sluicegate.jobs.model import Batch, BatchStatus, Job, JobState, StoredFile
from sluicegate.jobs.store import JobStore

OUTPUT_PURPOSE = "batch_output"
_OPEN = frozenset({BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING})
RESULT_PAGE = 500
"""Jobs read per statement while writing a batch's result files."""
_OUTPUT_STATES = (JobState.SUCCEEDED,)
_ERROR_STATES = tuple(s for s in JobState if s.final and s is not JobState.SUCCEEDED)


class BatchLedger:
    def __init__(self, intake: Intake) -> None:
        self._intake = intake
        self._settling: set[str] = set()

    async def job_finished(self, store: JobStore, job: Job) -> None:
        """A job's end settles its batch only once none of its jobs is left to run: one
        index probe per job, so a batch of n jobs costs n probes, not n full reads. It
        settles on `store`, the one the job ended in: the routes' may be gone already,
        since at shutdown they let go of it before the workers stop."""
        if job.batch_id is not None and not await store.batch_live(job.batch_id):
            await self._settle(store, job.tenant, job.batch_id)

    async def settle(self, tenant: str, batch_id: str) -> Batch | None:
        """The batch with its current counts, finished first if all its jobs are final.

        The counts come from the database by state; no job row is read unless the batch
        finishes here, and then each once, a page at a time."""
        return await self._settle(self._intake.store, tenant, batch_id)

    async def _settle(self, store: JobStore, tenant: str, batch_id: str) -> Batch | None:
        batch = await store.get_batch(tenant, batch_id)
        if batch is None or batch.status not in _OPEN:
            return batch
        counts = await store.batch_counts(batch_id)
        batch = _counted(batch, counts)
        if counts[JobState.QUEUED] or counts[JobState.RUNNING] or not self._may_finish(batch):
            return batch
        self._settling.add(batch_id)
        try:
            return await self._finish(store, batch, counts)
        finally:
            self._settling.discard(batch_id)

    def _may_finish(self, batch: Batch) -> bool:
        """Not while another settler here, or a live one elsewhere, writes its files."""
        if batch.id in self._settling:
            return False
        if batch.status is not BatchStatus.FINALIZING:
            return True
        since = batch.status_at.get(BatchStatus.FINALIZING.value, 0.0)
        return self._intake.clock.now() - since > self._intake.policy.lease_s

    async def _finish(
        self, store: JobStore, batch: Batch, counts: dict[JobState, int]
    ) -> Batch | None:
        if batch.status is BatchStatus.IN_PROGRESS:
            finalizing = replace(batch, status=BatchStatus.FINALIZING)
            if not await store.update_batch(finalizing, BatchStatus.IN_PROGRESS):
                return await store.get_batch(batch.tenant, batch.id)
            batch = _counted(await _reread(store, batch), counts)
        final = replace(
            batch,
            status=_final_status(batch, counts),
            output_file_id=await _write(store, batch, counts, "output", _OUTPUT_STATES),
            error_file_id=await _write(store, batch, counts, "errors", _ERROR_STATES),
        )
        await store.update_batch(final, batch.status)
        return await store.get_batch(batch.tenant, batch.id)


async def _write(
    store: JobStore,
    batch: Batch,
    counts: dict[JobState, int],
    kind: str,
    states: Sequence[JobState],
) -> str | None:
    """The file of the lines of the batch's jobs in `states`, if it has any. Result files
    are written whatever the tenant's storage quota: they hold work already done, which
    a refusal would lose; they count against later uploads."""
    present = [state for state in states if counts[state]]
    if not present:
        return None
    name = f"{batch.id}_{kind}.jsonl"
    file = StoredFile(tenant=batch.tenant, purpose=OUTPUT_PURPOSE, filename=name)
    return (await store.create_file(file, _result_lines(store, batch, present))).id


async def _reread(store: JobStore, batch: Batch) -> Batch:
    stored = await store.get_batch(batch.tenant, batch.id)
    assert stored is not None, "a finalizing batch is not retired"
    return stored


def _counted(batch: Batch, counts: dict[JobState, int]) -> Batch:
    succeeded = counts[JobState.SUCCEEDED]
    ended = sum(n for state, n in counts.items() if state.final)
    return replace(
        batch,
        total_requests=sum(counts.values()),
        completed_requests=succeeded,
        failed_requests=ended - succeeded,
    )


def _final_status(batch: Batch, counts: dict[JobState, int]) -> BatchStatus:
    if batch.status is BatchStatus.CANCELLING:
        return BatchStatus.CANCELLED
    if counts[JobState.EXPIRED]:
        return BatchStatus.EXPIRED
    return BatchStatus.COMPLETED


async def _result_lines(
    store: JobStore, batch: Batch, states: Sequence[JobState]
) -> AsyncIterator[bytes]:
    """The lines of the batch's jobs in `states`, a state at a time, read `RESULT_PAGE`
    at a time in order of an index: each job is read once, by the one file it goes in."""
    for state in states:
        after: str | None = None
        while page := await store.list_batch_jobs(
            batch.tenant, batch.id, state, RESULT_PAGE, after
        ):
            for job in page:
                yield _result_line(job)
            after = page[-1].id


def _result_line(job: Job) -> bytes:
    """OpenAI's output line for a success; its error line for every other end."""
    if job.state is JobState.SUCCEEDED:
        body = orjson.Fragment(job.result or b"null")
        return _line(job, {"status_code": 200, "request_id": job.id, "body": body})
    error = job_error(job) or {}
    status = error.get("status")
    if status is None:
        return _line(job, None, error)
    return _line(job, {"status_code": status, "request_id": job.id, "body": {"error": error}})


def _line(job: Job, response: dict[str, Any] | None, error: Any = None) -> bytes:
    line = {"id": f"batch_req_{job.id}", "custom_id": job.custom_id, "response": response}
    return orjson.dumps(line | {"error": error}) + b"\n"
