"""Job workers: stored jobs run through the same pipeline, lanes and pools as HTTP traffic.

A claimer leases due jobs into a bounded hand-off queue and `workers` tasks take them
from it. One heartbeat loop extends the lease of every job this process holds; when the
store refuses (the lease was lost, or a cancel was asked for) the job's dispatch is
cancelled, which ends its upstream call and frees its permits. A sweep expires jobs past
their deadline and refreshes the backlog metrics; a slower one deletes what ended more
than `retention_s` ago.

Delivery is at-least-once: a job whose process died while it ran is claimed again once
its lease has run out, and may reach a model twice. A process never claims a job it
still holds, and a lease that lapsed is never extended, so one process runs one job
once at a time. Every failure, expected or not, spends one of the job's attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, cast

import orjson

from sluicegate.core.clock import Clock
from sluicegate.core.errors import ErrorType, GatewayError
from sluicegate.core.ids import RequestContext, current
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Settings, Tenant
from sluicegate.jobs.model import Job, JobState
from sluicegate.jobs.store import JobStore
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.pipeline import Inbound, Pipeline

log = logging.getLogger("sluicegate.jobs")

OnFinal = Callable[[JobStore, Job], Awaitable[None]]
_PURGE_CHUNK = 1_000
"""Rows of each kind one retention transaction deletes."""


class Handoff:
    """The bounded queue between the claimer and the workers, and its full-queue policy.

    `wait` claims only what fits, so a full queue stops claiming until a worker takes a
    job. `reject` claims a whole queue's worth and hands back what does not fit, so no
    job waits here while another replica could start it.
    """

    def __init__(self, size: int, policy: str) -> None:
        self._queue: asyncio.Queue[Job] = asyncio.Queue(size)
        self._reject = policy == "reject"
        self._taken = asyncio.Event()
        self._closed = False

    def wanted(self) -> int:
        queue = self._queue
        return queue.maxsize if self._reject else queue.maxsize - queue.qsize()

    async def room(self) -> None:
        """Until a job fits, or the hand-off is closed."""
        while self._queue.full() and not self._closed:
            self._taken.clear()
            await self._taken.wait()

    def close(self) -> None:
        self._closed = True
        self._taken.set()

    def offer(self, job: Job) -> bool:
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            return False
        return True

    async def take(self) -> Job:
        job = await self._queue.get()
        self._taken.set()
        return job

    def drain(self) -> list[Job]:
        jobs: list[Job] = []
        while not self._queue.empty():
            jobs.append(self._queue.get_nowait())
        return jobs


class Workers:
    """This process's claimer, workers, heartbeats and expiry sweep over one job store."""

    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        metrics: GatewayMetrics,
        clock: Clock,
        wall: Clock,
    ) -> None:
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._policy = settings.jobs
        self._tenants = {tenant.name: tenant for tenant in settings.tenants}
        self._lanes = [lane.name for lane in settings.scheduling.lanes]
        self._pipeline = pipeline
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._handoff = Handoff(self._policy.handoff_size, self._policy.handoff_full)
        self._held: dict[str, asyncio.Task[bytes] | None] = {}
        """Every job this process leases: its model call while one runs, else None."""
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._idle: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._random = random.Random()
        self._store: JobStore
        self._on_final: OnFinal

    def start(self, store: JobStore, on_final: OnFinal) -> None:
        """Run over `store`; `on_final` hears of every batch job this process ends, and
        the store it ended in."""
        self._store, self._on_final = store, on_final
        loops = [
            self._repeat(self._claim_round),
            self._repeat(self._beat),
            self._repeat(self._sweep),
            self._repeat(self._retire),
            *(self._work() for _ in range(self._policy.workers)),
        ]
        self._tasks = [asyncio.get_running_loop().create_task(loop) for loop in loops]

    async def stop(self) -> None:
        """Stop claiming and hand every job held back to the store: a job interrupted by
        shutdown is queued again (or cancelled, if that was asked), never lost.

        Nothing is cancelled inside a store call, which could leave a transaction open:
        the loops end at their next wait, and only model calls and idle workers are
        cancelled."""
        self._stopping.set()
        self._wake.set()
        self._handoff.close()
        for task in (*self._idle, *self._held.values()):
            if task is not None:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for job in self._handoff.drain():
            await self._give_back(job)

    def wake(self) -> None:
        """Jobs were submitted here: claim now rather than at the next poll."""
        self._wake.set()

    async def _repeat(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run `step` until shutdown; a failure (the database is away) is logged and
        tried again after a poll interval."""
        while not self._stopping.is_set():
            try:
                await step()
            except Exception:
                log.exception("job %s failed; trying again", step.__name__)
                await self._rest(self._policy.poll_s)

    async def _rest(self, seconds: float) -> None:
        """Sleep, but not past the start of shutdown."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _claim_round(self) -> None:
        handoff = self._handoff
        await handoff.room()
        wanted = handoff.wanted()
        if self._stopping.is_set():
            return
        self._wake.clear()
        jobs = await self._store.claim(self.owner, self._policy.lease_s, wanted)
        overflow = [job for job in jobs if not self._hold(job)]
        for job in overflow:
            self._metrics.job_handed_back()
            await self._give_back(job)
        if len(jobs) < wanted:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._policy.poll_s)

    def _hold(self, job: Job) -> bool:
        if not self._handoff.offer(job):
            return False
        self._held[job.id] = None
        return True

    async def _beat(self) -> None:
        """Extend every lease held; stop the dispatch of a job whose lease the store refused."""
        await self._rest(self._policy.heartbeat_s)
        for job_id in list(self._held):
            if not await self._store.heartbeat(self.owner, job_id, self._policy.lease_s):
                call = self._held.pop(job_id, None)
                if call is not None:
                    call.cancel()

    async def _sweep(self) -> None:
        """Expire jobs past their deadline and refresh the backlog metrics: each reads
        only live jobs, by index."""
        await self._store.expire_due()
        for lane in self._lanes:
            size, oldest_age_s = await self._store.backlog(lane=lane)
            self._metrics.job_backlog(lane, size, oldest_age_s)
        await self._rest(self._policy.expiry_sweep_s)

    async def _retire(self) -> None:
        """Delete what ended before the retention window, a bounded chunk per transaction
        so claims and heartbeats interleave; then count the jobs by state, which reads
        the whole (now bounded) table and so runs at this slower pace."""
        policy = self._policy
        if policy.retention_s is not None:
            before = self._wall.now() - policy.retention_s
            while not self._stopping.is_set():
                purged = await self._store.purge(before, _PURGE_CHUNK)
                if max(purged) < _PURGE_CHUNK:
                    break
        counts = await self._store.counts_by_state()
        self._metrics.job_states({state.value: n for state, n in counts.items()})
        await self._rest(policy.retention_sweep_s)

    async def _work(self) -> None:
        """Take jobs until shutdown; cancelled only while waiting for one."""
        me = asyncio.current_task()
        assert me is not None
        while not self._stopping.is_set():
            self._idle.add(me)
            try:
                job = await self._handoff.take()
            finally:
                self._idle.discard(me)
            try:
                await self._dispatch(job)
            except Exception as exc:
                log.exception("job %s: its worker failed", job.id)
                await self._failed_unexpectedly(job, exc)
            finally:
                self._held.pop(job.id, None)

    async def _failed_unexpectedly(self, job: Job, exc: Exception) -> None:
        """An unexpected failure spends an attempt like any other: the job goes back after
        a backoff, or fails once it has had its attempts, so a job that always breaks its
        worker cannot loop until its deadline. If the store is away too, its lease runs
        out and the next claim counts the attempt."""
        err = GatewayError(
            500, "internal_error", f"the job's worker failed ({type(exc).__name__})",
            ErrorType.INTERNAL, failover=True,
        )  # fmt: skip
        try:
            await self._after(job, err)
        except Exception:
            log.exception("job %s: could not record its failure; it runs after its lease", job.id)

    async def _give_back(self, job: Job) -> None:
        """Queue a held job again at once; a cancel asked for makes it cancelled, and a
        lease already lost makes this do nothing."""
        await self._store.release(self.owner, job.id, 0.0, job.error)

    async def _dispatch(self, job: Job) -> None:
        """Check what may have changed since the job was claimed, then call the model."""
        current = await self._store.get(job.tenant, job.id)
        if current is None or current.state is not JobState.RUNNING:
            return  # superseded or expired meanwhile: never sent
        if current.lease_owner != self.owner:
            return  # our lease ran out and another claimer holds it now
        if job.id not in self._held:
            await self._give_back(current)  # the heartbeat found its lease lapsed
            return
        if current.cancel_requested:
            await self._end(current, JobState.CANCELLED)
            return
        left_s = None if current.deadline_at is None else current.deadline_at - self._wall.now()
        if left_s is not None and left_s <= 0:
            await self._end(current, JobState.EXPIRED)
            return
        tenant = self._tenant(current.tenant)
        if tenant is None:
            gone = GatewayError(
                403, "tenant_not_found", f"tenant {current.tenant} is gone", ErrorType.PERMISSION
            )
            await self._end(current, JobState.FAILED, error=_error(gone))
            return
        if self._stopping.is_set():
            await self._give_back(current)
            return
        await self._run(tenant, current, left_s)

    async def _run(self, tenant: Tenant, job: Job, left_s: float | None) -> None:
        """The model call, as a task the heartbeat or shutdown may cancel; a cancelled job
        goes back to the store."""
        call = asyncio.ensure_future(self._call(tenant, job, left_s))
        self._held[job.id] = call
        try:
            body = await call
        except asyncio.CancelledError:
            if not call.cancelled():
                raise
            await self._give_back(job)
        except GatewayError as err:
            await self._after(job, err)
        else:
            await self._end(job, JobState.SUCCEEDED, result=body)

    def _tenant(self, name: str) -> Tenant | None:
        """The job's tenant as configured now; without `recheck_auth`, a tenant since
        removed still runs, and a changed allow-list is not applied to accepted jobs."""
        tenant = self._tenants.get(name)
        if self._policy.recheck_auth:
            return tenant
        return replace(tenant or Tenant(name, None), allowed_models=None)

    async def _call(self, tenant: Tenant, job: Job, left_s: float | None) -> bytes:
        """One pipeline run, as an HTTP request makes it: the tenant's concurrency slot
        and quotas, then the lane's turn and every pool permit of the attempt, released
        when the attempt has ended."""

        async def payload() -> dict[str, Any]:
            return cast(dict[str, Any], orjson.loads(job.body))

        current.set(RequestContext(job.request_id or job.id))  # this task's own context

        inbound = Inbound(
            job.kind, tenant, self._clock.now(), payload, left_s, job.lane, interactive=False
        )
        async with self._pipeline.run(inbound) as answer:
            return await answer.read()

    async def _after(self, job: Job, err: GatewayError) -> None:
        """A refusal or an upstream failure sends the job back after a backoff, until it
        has had its attempts; a deadline that passed expires it; anything else fails it."""
        error = _error(err)
        if err.code == Refusal.DEADLINE:
            await self._end(job, JobState.EXPIRED, error=error)
        elif err.code == Refusal.BUDGET:
            await self._store.release(self.owner, job.id, self._over_budget_s(job, err), error)
        elif _worth_retrying(err) and job.attempts < self._policy.max_attempts:
            await self._store.release(self.owner, job.id, self._backoff_s(job, err), error)
        else:
            await self._end(job, JobState.FAILED, error=error)

    def _over_budget_s(self, job: Job, err: GatewayError) -> float:
        """A job over its tenant's budget stays queued until the budget's period ends
        (the refusal's Retry-After), whatever its attempts: it is no failure of its own.
        Due later than its deadline, it waits past it, for the expiry sweep to end it
        with this refusal as its error."""
        wait_s = err.retry_after_s or self._policy.backoff_cap_s
        if job.deadline_at is not None:
            wait_s = min(wait_s, max(0.0, job.deadline_at - self._wall.now()) + PAST_DEADLINE_S)
        return wait_s

    def _backoff_s(self, job: Job, err: GatewayError) -> float:
        """Full jitter on an exponential cap, but never sooner than the refusal's Retry-After."""
        policy = self._policy
        cap = min(policy.backoff_cap_s, policy.backoff_base_s * 2 ** (job.attempts - 1))
        return max(err.retry_after_s or 0.0, self._random.uniform(0, cap))

    async def _end(
        self,
        job: Job,
        state: JobState,
        result: bytes | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        if not await self._store.finish(self.owner, job.id, state, result, error):
            return
        self._metrics.job_finished(job.attempts)
        if job.batch_id is None:
            return
        try:
            await self._on_final(self._store, job)
        except Exception:
            log.exception("batch %s: settling failed; its next poll settles it", job.batch_id)


PAST_DEADLINE_S = 1.0
"""How long past its deadline a job over budget is held back, so that the expiry sweep
ends it before a claim could run it."""


def _worth_retrying(err: GatewayError) -> bool:
    """Upstream failures and refusals for lack of capacity; not a request that can never
    fit (a quota smaller than it), nor the caller's own mistakes."""
    if err.failover:
        return True
    if err.status not in (429, 503):
        return False
    return err.should_retry is not False or err.code == Refusal.EXPIRED


def _error(err: GatewayError) -> dict[str, Any]:
    return {
        "code": err.code,
        "message": err.message,
        "type": err.error_type.value,
        "status": err.status,
    }
