"""The hand-off queue between the claimer and the workers, under each full-queue policy;
and workers over a real SQLite store with a scripted pipeline of the project's own."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, cast

from sluicegate.core.types import Endpoint
from sluicegate.jobs.model import Job, JobState
from sluicegate.jobs.sqlite import open_sqlite
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.pipeline import Pipeline
from sluicegate.worker import Handoff, Workers
from tests.config.test_config import base, parse
from tests.support.clock import FakeClock


def job() -> Job:
    return Job(tenant="alice", kind=Endpoint.CHAT, body=b"{}", lane="batch")


async def test_wait_claims_only_what_fits_and_waits_for_room():
    handoff = Handoff(2, "wait")
    assert handoff.wanted() == 2
    assert handoff.offer(job())
    assert handoff.wanted() == 1
    assert handoff.offer(job())
    assert handoff.wanted() == 0
    room = asyncio.ensure_future(handoff.room())
    await asyncio.sleep(0)
    assert not room.done()
    await handoff.take()
    await asyncio.wait_for(room, 1)
    assert handoff.wanted() == 1


async def test_reject_claims_a_queues_worth_and_refuses_what_does_not_fit():
    handoff = Handoff(2, "reject")
    offered = [handoff.offer(job()) for _ in range(3)]
    assert offered == [True, True, False]
    assert handoff.wanted() == 2


async def test_closing_ends_the_wait_for_room_and_drain_returns_the_queued_jobs():
    handoff = Handoff(1, "wait")
    queued = job()
    handoff.offer(queued)
    room = asyncio.ensure_future(handoff.room())
    await asyncio.sleep(0)
    handoff.close()
    await asyncio.wait_for(room, 1)
    assert handoff.drain() == [queued]
    assert handoff.drain() == []


class BrokenPipeline:
    """A pipeline whose every run fails in a way no one planned for."""

    def __init__(self) -> None:
        self.runs = 0

    @asynccontextmanager
    async def run(self, inbound: Any):
        self.runs += 1
        raise RuntimeError("a bug in the request path")
        yield


async def ended_within(store: Any, job_id: str, timeout_s: float) -> Job:
    """The job once final, polled: the store has no change notifications."""
    async with asyncio.timeout(timeout_s):
        while not (job := await store.get("alice", job_id)).state.final:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    return job


async def test_a_job_that_breaks_its_worker_spends_an_attempt_each_time(tmp_path):
    jobs = {"max_attempts": 3, "poll_s": 0.02, "backoff_base_s": 0.0, "lease_s": 600.0}
    settings = parse(base() | {"jobs": jobs})
    clock = FakeClock(1_700_000_000.0)
    store = await open_sqlite(tmp_path / "jobs.db", clock)
    pipeline = BrokenPipeline()
    workers = Workers(settings, cast(Pipeline, pipeline), GatewayMetrics(), clock, clock)
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}'
    poison = await store.submit(Job(tenant="alice", kind=Endpoint.CHAT, body=body, lane="batch"))

    async def on_final(job: Job) -> None:
        """Not a batch job: never called."""

    workers.start(store, on_final)
    try:
        ended = await ended_within(store, poison.id, 10)
    finally:
        await workers.stop()
        await store.close()
    assert (ended.state, ended.attempts, pipeline.runs) == (JobState.FAILED, 3, 3)
    assert ended.error["code"] == "internal_error"
