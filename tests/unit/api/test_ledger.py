"""Batches settled from their jobs' ends, on the store those jobs ended in."""

from __future__ import annotations

from sluicegate.api.intake import Intake
from sluicegate.api.ledger import BatchLedger
from sluicegate.core.types import Endpoint
from sluicegate.jobs.model import Batch, BatchStatus, Job, JobState
from sluicegate.jobs.sqlite import open_sqlite
from tests.config.test_config import base, parse
from tests.support.clock import FakeClock


async def test_a_job_ending_as_the_server_stops_still_settles_its_batch(tmp_path):
    """At shutdown the routes let go of the store (they answer 503) before the workers
    have stopped; a batch job a worker ends then still settles its batch."""
    clock = FakeClock(1_700_000_000.0)
    intake = Intake(parse(base() | {"jobs": {}}), clock, lambda: None)
    store = await open_sqlite(tmp_path / "jobs.db", clock)
    try:
        intake.attach(store)
        ledger = BatchLedger(intake)
        running = Batch(
            tenant="alice",
            input_file_id="file-x",
            endpoint=Endpoint.CHAT.path,
            completion_window="24h",
            status=BatchStatus.IN_PROGRESS,
            total_requests=1,
        )
        body = b'{"model": "chat", "messages": []}'
        only = Job(tenant="alice", kind=Endpoint.CHAT, body=body, lane="batch", custom_id="r0")
        batch = await store.create_batch(running, [only])
        [job] = await store.claim("w", 600, 1)
        intake.attach(None)
        assert await store.finish("w", job.id, JobState.SUCCEEDED, result=b"{}")
        await ledger.job_finished(store, job)
        settled = await store.get_batch("alice", batch.id)
    finally:
        await store.close()
    assert settled.status is BatchStatus.COMPLETED
