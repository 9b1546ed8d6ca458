"""The hand-off queue between the claimer and the workers, under each full-queue policy;
and workers over a real SQLite store with a scripted pipeline of the project's own."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, cast

import orjson

from sluicegate.core.refusals import Refusal
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

    async def on_final(ended_in: Any, job: Job) -> None:
        """Not a batch job: never called."""

    workers.start(store, on_final)
    try:
        ended = await ended_within(store, poison.id, 10)
    finally:
        await workers.stop()
        await store.close()
    assert (ended.state, ended.attempts, pipeline.runs) == (JobState.FAILED, 3, 3)
    assert ended.error["code"] == "internal_error"


class Answer:
    async def read(self) -> bytes:
        return b"{}"


class LeaseCheckingPipeline:
    """Holds the first run of the job saying "hold" until cancelled; records, for every
    run, whether the store still leased that job to someone when the run began."""

    def __init__(self, store: Any, clock: FakeClock) -> None:
        self.store, self.clock = store, clock
        self.ids: dict[str, str] = {}
        self.holding = asyncio.Event()
        self.leased: list[tuple[str, bool]] = []

    @asynccontextmanager
    async def run(self, inbound: Any):
        payload = await inbound.payload()
        content = payload["messages"][0]["content"]
        job = await self.store.get("alice", self.ids[content])
        self.leased.append((content, job.lease_until > self.clock.now()))
        if content == "hold" and not self.holding.is_set():
            self.holding.set()
            await asyncio.Event().wait()
        yield Answer()


async def test_a_job_whose_lease_lapsed_while_it_waited_for_a_worker_is_not_run_on_it(tmp_path):
    """A heartbeat stall longer than the lease: the job waiting in the hand-off must go
    back to the store, not run on a lease another claimer may take."""
    jobs = {"workers": 1, "handoff_size": 2, "lease_s": 10.0, "heartbeat_s": 0.05}
    settings = parse(base() | {"jobs": jobs | {"poll_s": 0.02}})
    clock = FakeClock(1_700_000_000.0)
    store = await open_sqlite(tmp_path / "jobs.db", clock)
    pipeline = LeaseCheckingPipeline(store, clock)
    workers = Workers(settings, cast(Pipeline, pipeline), GatewayMetrics(), clock, clock)
    for content, priority in (("hold", 1), ("wait", 0)):
        body = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": content}]})
        job = Job(tenant="alice", kind=Endpoint.CHAT, body=body, lane="batch", priority=priority)
        pipeline.ids[content] = (await store.submit(job)).id

    async def on_final(ended_in: Any, job: Job) -> None:
        """Not a batch job: never called."""

    workers.start(store, on_final)
    try:
        await asyncio.wait_for(pipeline.holding.wait(), 5)
        clock.advance(11)
        for content in ("wait", "hold"):
            assert (
                await ended_within(store, pipeline.ids[content], 10)
            ).state is JobState.SUCCEEDED
    finally:
        await workers.stop()
        await store.close()
    assert ("wait", True) in pipeline.leased
    assert ("wait", False) not in pipeline.leased


class OverBudgetPipeline:
    """Every run refused as the budgets refuse: over budget until the period's end."""

    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        self.runs = 0

    @asynccontextmanager
    async def run(self, inbound: Any):
        self.runs += 1
        err = Refusal.BUDGET.error("tenant alice's daily budget has no room")
        err.retry_after_s, err.should_retry = self.retry_after_s, False
        raise err
        yield


async def queued_again(store: Any, job_id: str) -> Job:
    async with asyncio.timeout(10):
        while (found := await store.get("alice", job_id)).error is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    return found


async def test_a_job_over_budget_waits_for_the_period_or_its_deadline(tmp_path):
    jobs = {"max_attempts": 1, "poll_s": 0.02, "lease_s": 600.0}
    settings = parse(base() | {"jobs": jobs})
    clock = FakeClock(1_700_000_000.0)
    store = await open_sqlite(tmp_path / "jobs.db", clock)
    pipeline = OverBudgetPipeline(retry_after_s=3600.0)
    workers = Workers(settings, cast(Pipeline, pipeline), GatewayMetrics(), clock, clock)
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}'
    submitted = [
        await store.submit(
            Job(tenant="alice", kind=Endpoint.CHAT, body=body, lane="batch", deadline_at=deadline)
        )
        for deadline in (None, clock.now() + 600.0)
    ]

    async def on_final(ended_in: Any, job: Job) -> None:
        """Not a batch job: never called."""

    workers.start(store, on_final)
    try:
        waiting, short = [await queued_again(store, job.id) for job in submitted]
    finally:
        await workers.stop()
    try:
        assert (waiting.state, waiting.not_before) == (JobState.QUEUED, clock.now() + 3600.0)
        assert waiting.error["code"] == "budget_exceeded"
        assert short.not_before == clock.now() + 601.0
        clock.advance(600.0)
        assert await store.expire_due() == 1
        ended = await store.get("alice", short.id)
        assert (ended.state, ended.error["code"]) == (JobState.EXPIRED, "budget_exceeded")
    finally:
        await store.close()
