"""One suite for every `JobStore`: SQLite and PostgreSQL must behave the same."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import asyncpg
import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Endpoint
from sluicegate.jobs.model import Batch, BatchStatus, Job, JobState, StoredFile
from sluicegate.jobs.postgres import PostgresDatabase
from sluicegate.jobs.rows import job_row
from sluicegate.jobs.schema import MIGRATIONS, migrate
from sluicegate.jobs.sql import Database
from sluicegate.jobs.sqlite import connect_sqlite
from sluicegate.jobs.store import StorageQuotaExceeded

BODY = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}]}'


def job(tenant: str = "alice", **fields) -> Job:
    return Job(**{"tenant": tenant, "kind": Endpoint.CHAT, "body": BODY, "lane": "batch"} | fields)


async def state(store, job_id: str, tenant: str = "alice") -> JobState:
    return (await store.get(tenant, job_id)).state


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def put_file(
    store, content: bytes, tenant: str = "alice", quota_bytes: int | None = None, **fields
) -> StoredFile:
    file = StoredFile(**{"tenant": tenant, "purpose": "batch", "filename": "in.jsonl"} | fields)
    return await store.create_file(file, pieces(content), quota_bytes)


async def content_of(store, file: StoredFile) -> bytes:
    return b"".join([chunk async for chunk in store.read_file(file)])


async def test_submit_stores_every_field(store, clock):
    submitted = job(
        kind=Endpoint.EMBEDDINGS,
        priority=3,
        deadline_at=clock.now() + 60,
        idempotency_key="req-1",
        version_key="doc-7",
        version=2,
        custom_id="line-1",
    )
    stored = await store.submit(submitted)
    assert stored == replace(submitted, created_at=clock.now(), updated_at=clock.now())
    assert await store.get("alice", submitted.id) == stored


async def test_an_idempotency_key_returns_the_tenants_existing_job(store, clock):
    first = await store.submit(job(idempotency_key="k"))
    clock.advance(5)
    again = await store.submit(job(idempotency_key="k", body=b"{}"))
    other = await store.submit(job("bob", idempotency_key="k"))
    assert again == first
    assert other.id != first.id
    assert await store.list_jobs("alice", 10) == [first]


async def test_submitting_the_same_job_twice_stores_it_once(store):
    first = await store.submit(job())
    assert await store.submit(first) == first
    assert len(await store.list_jobs("alice", 10)) == 1


async def test_a_newer_version_supersedes_the_unfinished_older_ones(store, clock):
    done = await store.submit(job(version_key="doc", version=0))
    await store.claim("w", 30, 1)
    await store.finish("w", done.id, JobState.SUCCEEDED, result=b"{}")
    clock.advance(1)
    running = await store.submit(job(version_key="doc", version=1))
    await store.claim("w", 30, 1)
    clock.advance(1)
    queued = await store.submit(job(version_key="doc", version=2))
    unrelated = await store.submit(job(version_key="other", version=1))
    bobs = await store.submit(job("bob", version_key="doc", version=1))
    newest = await store.submit(job(version_key="doc", version=3))

    assert newest.state is JobState.QUEUED
    assert await state(store, done.id) is JobState.SUCCEEDED
    assert await state(store, running.id) is JobState.SUPERSEDED
    assert await state(store, queued.id) is JobState.SUPERSEDED
    assert await state(store, unrelated.id) is JobState.QUEUED
    assert await state(store, bobs.id, "bob") is JobState.QUEUED
    assert not await store.heartbeat("w", running.id, 30)
    assert not await store.finish("w", running.id, JobState.SUCCEEDED)


async def test_concurrent_versions_leave_only_the_newest_unfinished(open_store):
    stores = [await open_store() for _ in range(4)]
    submits = [stores[v % 4].submit(job(version_key="doc", version=v)) for v in range(20)]
    await asyncio.gather(*submits)
    jobs = await stores[0].list_jobs("alice", 100)
    assert [j.version for j in jobs if j.state is JobState.QUEUED] == [19]


async def test_a_job_older_than_a_stored_version_is_stored_superseded(store):
    newer = await store.submit(job(version_key="doc", version=5))
    stale = await store.submit(job(version_key="doc", version=4))
    assert stale.state is JobState.SUPERSEDED
    assert await state(store, newer.id) is JobState.QUEUED


async def test_a_tenant_sees_and_cancels_only_its_own_jobs(store):
    alices = await store.submit(job())
    assert await store.get("bob", alices.id) is None
    assert await store.cancel("bob", alices.id) is None
    assert await store.list_jobs("bob", 10) == []
    assert await store.get("alice", alices.id) == alices


async def test_list_pages_newest_first(store, clock):
    jobs = []
    for _ in range(5):
        jobs.append(await store.submit(job()))
        clock.advance(1)
    newest_first = jobs[::-1]
    pages, after = [], None
    while page := await store.list_jobs("alice", 2, after):
        pages.append(page)
        after = page[-1].id
    assert [[j.id for j in page] for page in pages] == [
        [j.id for j in newest_first[i : i + 2]] for i in range(0, 5, 2)
    ]


async def test_cancel_ends_a_queued_job_at_once(store, clock):
    queued = await store.submit(job())
    clock.advance(1)
    cancelled = await store.cancel("alice", queued.id)
    assert (cancelled.state, cancelled.updated_at) == (JobState.CANCELLED, clock.now())
    assert await store.claim("w", 30, 10) == []


async def test_cancel_asks_the_worker_of_a_running_job_to_stop(store):
    running = await store.submit(job())
    await store.claim("w", 30, 1)
    flagged = await store.cancel("alice", running.id)
    assert (flagged.state, flagged.cancel_requested) == (JobState.RUNNING, True)
    assert not await store.heartbeat("w", running.id, 30)
    assert await store.finish("w", running.id, JobState.CANCELLED)
    assert await state(store, running.id) is JobState.CANCELLED


async def test_cancel_leaves_a_final_job_unchanged(store, clock):
    submitted = await store.submit(job())
    await store.claim("w", 30, 1)
    await store.finish("w", submitted.id, JobState.SUCCEEDED, result=b"{}")
    finished = await store.get("alice", submitted.id)
    clock.advance(1)
    assert await store.cancel("alice", submitted.id) == finished


async def test_a_released_job_whose_cancel_was_requested_is_cancelled(store):
    running = await store.submit(job())
    await store.claim("w", 30, 1)
    await store.cancel("alice", running.id)
    assert await store.release("w", running.id, 0)
    assert await state(store, running.id) is JobState.CANCELLED


async def test_a_cancel_requested_job_whose_worker_died_is_cancelled(store, clock):
    running = await store.submit(job())
    await store.claim("dead", 10, 1)
    await store.cancel("alice", running.id)
    clock.advance(11)
    assert await store.claim("w", 30, 10) == []
    assert await state(store, running.id) is JobState.CANCELLED


async def test_claim_serves_priority_then_age(store, clock):
    low_old = await store.submit(job(priority=0))
    clock.advance(1)
    high_old = await store.submit(job(priority=5))
    clock.advance(1)
    high_new = await store.submit(job(priority=5))
    clock.advance(1)
    low_new = await store.submit(job(priority=0))
    first = await store.claim("w", 30, 3)
    assert [j.id for j in first] == [high_old.id, high_new.id, low_old.id]
    assert [j.id for j in await store.claim("w", 30, 3)] == [low_new.id]


async def test_claim_leases_the_job_and_counts_the_attempt(store, clock):
    submitted = await store.submit(job())
    [claimed] = await store.claim("w", 30, 1)
    assert claimed.id == submitted.id
    assert (claimed.state, claimed.lease_owner) == (JobState.RUNNING, "w")
    assert (claimed.lease_until, claimed.attempts) == (clock.now() + 30, 1)
    assert await store.get("alice", submitted.id) == claimed


async def test_claim_takes_only_the_lanes_asked_for(store):
    interactive = await store.submit(job(lane="interactive"))
    await store.submit(job())
    assert await store.claim("w", 30, 10, lanes=[]) == []
    assert [j.id for j in await store.claim("w", 30, 10, lanes=["interactive"])] == [interactive.id]


async def test_concurrent_claimers_never_share_a_job(open_store):
    stores = [await open_store() for _ in range(4)]
    submitted = {(await stores[0].submit(job())).id for _ in range(50)}
    claimers = [(store, f"w{i}") for i, store in enumerate(stores * 2)]

    async def drain(store, owner: str) -> list[str]:
        taken = []
        while claimed := await store.claim(owner, 60, 3):
            taken += [j.id for j in claimed]
        return taken

    taken = await asyncio.gather(*(drain(store, owner) for store, owner in claimers))
    every = [job_id for ids in taken for job_id in ids]
    assert len(every) == len(set(every)) == 50
    assert set(every) == submitted


async def test_a_job_whose_lease_ran_out_is_claimed_again(store, clock):
    submitted = await store.submit(job())
    await store.claim("dead", 30, 1)
    clock.advance(29)
    assert await store.claim("w", 30, 1) == []
    clock.advance(1)
    [again] = await store.claim("w", 30, 1)
    assert (again.id, again.lease_owner, again.attempts) == (submitted.id, "w", 2)
    assert not await store.heartbeat("dead", submitted.id, 30)
    assert not await store.finish("dead", submitted.id, JobState.SUCCEEDED)


async def test_a_heartbeat_extends_the_lease(store, clock):
    submitted = await store.submit(job())
    await store.claim("w", 10, 1)
    clock.advance(8)
    assert await store.heartbeat("w", submitted.id, 10)
    clock.advance(8)
    assert await store.claim("other", 10, 1) == []


async def test_only_the_lease_owner_finishes_a_job(store):
    submitted = await store.submit(job())
    await store.claim("w", 30, 1)
    error = {"code": "upstream_error", "message": "boom"}
    assert not await store.finish("other", submitted.id, JobState.FAILED, error=error)
    assert await store.finish("w", submitted.id, JobState.FAILED, error=error)
    finished = await store.get("alice", submitted.id)
    assert (finished.state, finished.error) == (JobState.FAILED, error)
    assert not await store.finish("w", submitted.id, JobState.SUCCEEDED)


async def test_a_job_finishes_only_in_a_final_state(store):
    submitted = await store.submit(job())
    await store.claim("w", 30, 1)
    with pytest.raises(ValueError, match="queued"):
        await store.finish("w", submitted.id, JobState.QUEUED)


async def test_a_finished_job_keeps_its_result(store):
    submitted = await store.submit(job())
    await store.claim("w", 30, 1)
    assert await store.finish("w", submitted.id, JobState.SUCCEEDED, result=b'{"id": "x"}')
    assert (await store.get("alice", submitted.id)).result == b'{"id": "x"}'


async def test_a_released_job_returns_after_its_delay_keeping_attempts(store, clock):
    submitted = await store.submit(job())
    await store.claim("w", 30, 1)
    refusal = {"code": "capacity_exhausted"}
    assert not await store.release("other", submitted.id, 10, refusal)
    assert await store.release("w", submitted.id, 10, refusal)
    released = await store.get("alice", submitted.id)
    assert (released.state, released.not_before) == (JobState.QUEUED, clock.now() + 10)
    assert (released.attempts, released.error, released.lease_owner) == (1, refusal, None)
    clock.advance(9)
    assert await store.claim("w", 30, 1) == []
    clock.advance(1)
    [again] = await store.claim("w", 30, 1)
    assert again.attempts == 2


async def test_jobs_past_their_deadline_expire_and_are_never_claimed(store, clock):
    queued = await store.submit(job(deadline_at=clock.now() + 5))
    running = await store.submit(job(deadline_at=clock.now() + 5, priority=1))
    await store.claim("w", 60, 1)
    timeless = await store.submit(job())
    clock.advance(5)
    assert [j.id for j in await store.claim("w", 60, 10)] == [timeless.id]
    assert await store.expire_due() == 2
    assert await state(store, queued.id) is JobState.EXPIRED
    assert await state(store, running.id) is JobState.EXPIRED
    assert not await store.heartbeat("w", running.id, 60)
    assert await store.expire_due() == 0


async def test_backlog_counts_queued_jobs_and_the_oldest_age(store, clock):
    assert await store.backlog() == (0, 0.0)
    await store.submit(job())
    clock.advance(10)
    await store.submit(job("bob"))
    clock.advance(10)
    await store.submit(job(lane="interactive"))
    clock.advance(10)
    assert await store.backlog() == (3, 30.0)
    assert await store.backlog(tenant="bob") == (1, 20.0)
    assert await store.backlog(lane="interactive") == (1, 10.0)
    assert await store.backlog(tenant="alice", lane="batch") == (1, 30.0)
    await store.claim("w", 60, 1)
    assert await store.backlog() == (2, 20.0)


async def test_counts_by_state_names_every_state(store):
    assert await store.counts_by_state() == dict.fromkeys(JobState, 0)
    for _ in range(3):
        await store.submit(job())
    [claimed] = await store.claim("w", 30, 1)
    await store.finish("w", claimed.id, JobState.SUCCEEDED)
    [claimed] = await store.claim("w", 30, 1)
    counts = await store.counts_by_state()
    assert counts[JobState.QUEUED] == counts[JobState.RUNNING] == counts[JobState.SUCCEEDED] == 1
    assert sum(counts.values()) == 3


async def test_a_file_is_stored_for_its_tenant_only(store, clock):
    created = await put_file(store, b"{}\n")
    assert created.id.startswith("file-")
    assert (created.created_at, created.size) == (clock.now(), 3)
    assert await store.get_file("alice", created.id) == created
    assert await content_of(store, created) == b"{}\n"
    assert await store.get_file("bob", created.id) is None


async def create_batch(store, lines: int = 3) -> Batch:
    input_file = await put_file(store, b"{}\n" * lines)
    batch = Batch(
        tenant="alice",
        input_file_id=input_file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        status=BatchStatus.IN_PROGRESS,
        total_requests=lines,
        metadata={"purpose": "test"},
    )
    return await store.create_batch(batch, [job(custom_id=f"r{i}") for i in range(lines)])


async def test_a_batch_is_stored_with_its_jobs(store, clock):
    batch = await create_batch(store)
    assert batch.id.startswith("batch_")
    assert batch.status_at == {"in_progress": clock.now()}
    assert await store.get_batch("alice", batch.id) == batch
    jobs = await store.list_batch_jobs("alice", batch.id, JobState.QUEUED, 100)
    assert sorted(j.custom_id for j in jobs) == ["r0", "r1", "r2"]
    assert {(j.batch_id, j.state) for j in jobs} == {(batch.id, JobState.QUEUED)}
    assert await store.list_batch_jobs("alice", batch.id, JobState.RUNNING, 100) == []
    assert await store.get_batch("bob", batch.id) is None
    assert await store.list_batch_jobs("bob", batch.id, JobState.QUEUED, 100) == []


async def test_a_batch_update_applies_only_from_the_expected_status(store, clock):
    batch = await create_batch(store)
    clock.advance(5)
    output = await put_file(store, b"{}", purpose="batch_output", filename="out.jsonl")
    finalizing = replace(
        batch, status=BatchStatus.FINALIZING, completed_requests=3, output_file_id=output.id
    )
    assert await store.update_batch(finalizing, BatchStatus.IN_PROGRESS)
    assert not await store.update_batch(finalizing, BatchStatus.IN_PROGRESS)
    stored = await store.get_batch("alice", batch.id)
    assert stored == replace(
        finalizing,
        status_at=batch.status_at | {"finalizing": clock.now()},
        updated_at=clock.now(),
    )


async def test_cancelling_a_batch_cancels_its_jobs(store, clock):
    batch = await create_batch(store)
    [running] = await store.claim("w", 30, 1)
    clock.advance(1)
    assert await store.cancel_batch("bob", batch.id) is None
    cancelling = await store.cancel_batch("alice", batch.id)
    assert cancelling.status is BatchStatus.CANCELLING
    assert cancelling.status_at["cancelling"] == clock.now()
    assert await store.get_batch("alice", batch.id) == cancelling
    [flagged] = await store.list_batch_jobs("alice", batch.id, JobState.RUNNING, 100)
    assert (flagged.id, flagged.cancel_requested) == (running.id, True)
    assert len(await store.list_batch_jobs("alice", batch.id, JobState.CANCELLED, 100)) == 2
    assert await store.cancel_batch("alice", batch.id) == cancelling


async def test_cancelling_a_finished_batch_changes_nothing(store):
    batch = await create_batch(store, lines=0)
    completed = replace(batch, status=BatchStatus.COMPLETED)
    await store.update_batch(completed, BatchStatus.IN_PROGRESS)
    stored = await store.get_batch("alice", batch.id)
    assert await store.cancel_batch("alice", batch.id) == stored


async def test_stores_opened_together_share_one_migrated_database(open_store):
    stores = await asyncio.gather(*(open_store() for _ in range(3)))
    submitted = await stores[0].submit(job())
    reopened = await open_store()
    assert await reopened.get("alice", submitted.id) == submitted


async def test_a_claimer_never_claims_again_a_job_it_still_holds(store, clock):
    held = await store.submit(job())
    await store.claim("w", 10, 1)
    clock.advance(11)
    assert await store.claim("w", 10, 10) == []
    [taken] = await store.claim("other", 10, 10)
    assert (taken.id, taken.lease_owner) == (held.id, "other")


async def test_a_heartbeat_never_extends_a_lapsed_lease(store, clock):
    held = await store.submit(job())
    await store.claim("w", 10, 1)
    clock.advance(10)
    assert not await store.heartbeat("w", held.id, 10)
    assert (await store.get("alice", held.id)).lease_until == clock.now()


async def test_claims_take_a_turn_per_tenant_and_priority_orders_within_one(store, clock):
    alice = []
    for _ in range(3):
        alice.append(await store.submit(job(priority=2**31 - 1)))
        clock.advance(1)
    bob_low = await store.submit(job("bob", priority=-5))
    bob_high = await store.submit(job("bob", priority=7))
    carol = await store.submit(job("carol", priority=-(2**31)))
    first = [j.id for j in await store.claim("w", 30, 3)]
    assert first == [alice[0].id, bob_high.id, carol.id]
    rest = [j.id for j in await store.claim("w", 30, 10)]
    assert rest == [alice[1].id, bob_low.id, alice[2].id]


async def test_claims_rotate_the_tenant_served_first(store):
    for tenant in ("alice", "bob", "carol"):
        for _ in range(2):
            await store.submit(job(tenant))
    tenants = [[j.tenant for j in await store.claim("w", 30, 2)] for _ in range(3)]
    assert tenants == [["alice", "bob"], ["carol", "alice"], ["bob", "carol"]]


async def test_a_batch_is_counted_by_state_and_paged_oldest_first(store, clock):
    batch = await create_batch(store, lines=1_200)
    assert await store.batch_live(batch.id)
    claimed = await store.claim("w", 30, 3)
    await store.finish("w", claimed[0].id, JobState.SUCCEEDED, result=b"{}")
    await store.finish("w", claimed[1].id, JobState.FAILED, error={"code": "x"})
    counts = await store.batch_counts(batch.id)
    assert (counts[JobState.QUEUED], counts[JobState.RUNNING]) == (1_197, 1)
    assert (counts[JobState.SUCCEEDED], counts[JobState.FAILED]) == (1, 1)
    pages: dict[JobState, list[list[Job]]] = {}
    for each in JobState:
        after = None
        while page := await store.list_batch_jobs("alice", batch.id, each, 500, after):
            pages.setdefault(each, []).append(page)
            after = page[-1].id
    sizes = {each: [len(page) for page in state_pages] for each, state_pages in pages.items()}
    assert sizes == {
        JobState.QUEUED: [500, 500, 197],
        JobState.RUNNING: [1],
        JobState.SUCCEEDED: [1],
        JobState.FAILED: [1],
    }
    queued = [j for page in pages[JobState.QUEUED] for j in page]
    assert queued == sorted(queued, key=lambda j: (j.created_at, j.id))
    every = [j.custom_id for state_pages in pages.values() for page in state_pages for j in page]
    assert sorted(every) == sorted(f"r{i}" for i in range(1_200))
    await store.cancel_batch("alice", batch.id)
    await store.finish("w", claimed[2].id, JobState.CANCELLED)
    assert not await store.batch_live(batch.id)


async def test_files_are_listed_newest_first_and_deleted_for_their_tenant_only(store, clock):
    files = []
    for n in range(3):
        files.append(await put_file(store, b"x" * (n + 1), filename=f"{n}.jsonl"))
        clock.advance(1)
    listed = await store.list_files("alice", 2)
    assert [(f.id, f.size) for f in listed] == [(files[2].id, 3), (files[1].id, 2)]
    assert [f.id for f in await store.list_files("alice", 2, listed[-1].id)] == [files[0].id]
    assert await store.list_files("bob", 10) == []
    assert not await store.delete_file("bob", files[0].id)
    assert await store.delete_file("alice", files[0].id)
    assert not await store.delete_file("alice", files[0].id)
    assert await store.get_file("alice", files[0].id) is None


async def test_a_file_past_the_tenants_quota_is_refused(store):
    await put_file(store, b"x" * 600, quota_bytes=1_000)
    with pytest.raises(StorageQuotaExceeded):
        await put_file(store, b"x" * 401, quota_bytes=1_000)
    await put_file(store, b"x" * 1_000, "bob", quota_bytes=1_000)
    await put_file(store, b"x" * 400, quota_bytes=1_000)
    assert len(await store.list_files("alice", 10)) == 2


async def test_batches_are_listed_newest_first(store, clock):
    batches = []
    for _ in range(3):
        batches.append(await create_batch(store, lines=1))
        clock.advance(1)
    page = await store.list_batches("alice", 2)
    assert [b.id for b in page] == [batches[2].id, batches[1].id]
    assert [b.id for b in await store.list_batches("alice", 2, page[-1].id)] == [batches[0].id]
    assert await store.list_batches("bob", 10) == []


async def test_retention_deletes_only_what_ended_before_the_cutoff(store, clock):
    old_done = await store.submit(job())
    await store.claim("w", 30, 1)
    await store.finish("w", old_done.id, JobState.SUCCEEDED, result=b"{}")
    old_queued = await store.submit(job())
    old_file = await put_file(store, b"{}")
    old_batch = await create_batch(store, lines=2)
    await store.cancel_batch("alice", old_batch.id)
    await store.update_batch(
        replace(await store.get_batch("alice", old_batch.id), status=BatchStatus.CANCELLED),
        BatchStatus.CANCELLING,
    )
    live_batch = await create_batch(store, lines=1)
    clock.advance(100)
    cutoff = clock.now()
    new_done = await store.submit(job())
    [claimed] = await store.claim("w", 30, 1)
    await store.finish("w", claimed.id, JobState.SUCCEEDED, result=b"{}")

    purged = await store.purge(cutoff, 1_000)
    assert (purged.jobs, purged.batches) == (3, 1)
    assert purged.files >= 1
    assert await store.get("alice", old_done.id) is None
    assert await store.get("alice", old_queued.id) is not None
    assert await store.get("alice", new_done.id) is not None
    assert await store.get_file("alice", old_file.id) is None
    assert await store.get_batch("alice", old_batch.id) is None
    assert sum((await store.batch_counts(old_batch.id)).values()) == 0
    assert await store.get_batch("alice", live_batch.id) is not None
    assert sum((await store.batch_counts(live_batch.id)).values()) == 1
    assert await store.purge(cutoff, 1_000) == (0, 0, 0)


async def test_retention_deletes_a_large_batch_a_bounded_chunk_at_a_time(store, clock):
    batch = await create_batch(store, lines=5)
    await store.cancel_batch("alice", batch.id)
    cancelling = await store.get_batch("alice", batch.id)
    await store.update_batch(
        replace(cancelling, status=BatchStatus.CANCELLED), BatchStatus.CANCELLING
    )
    clock.advance(10)
    rounds = [await store.purge(clock.now(), 2) for _ in range(4)]
    assert [(p.jobs, p.batches) for p in rounds] == [(2, 0), (2, 0), (1, 1), (0, 0)]


MIB = 1024 * 1024


async def chunk_rows(store, file_id: str) -> list[int]:
    async with store._db.read() as session:
        query = "SELECT seq, LENGTH(data) AS n FROM file_chunks WHERE file_id = :id ORDER BY seq"
        return [row["n"] for row in await session.fetch(query, {"id": file_id})]


async def test_a_file_is_kept_as_chunks_and_read_back_a_chunk_at_a_time(store):
    content = bytes(range(256)) * (10 * MIB // 256 // 4)
    odd_pieces = [content[i : i + 70_001] for i in range(0, len(content), 70_001)]
    file = StoredFile(tenant="alice", purpose="batch", filename="big.jsonl")
    created = await store.create_file(file, pieces(*odd_pieces))
    assert created.size == len(content) == 2.5 * MIB
    assert await chunk_rows(store, created.id) == [MIB, MIB, MIB // 2]
    chunks = [chunk async for chunk in store.read_file(created)]
    assert [len(chunk) for chunk in chunks] == [MIB, MIB, MIB // 2]
    assert b"".join(chunks) == content


async def test_a_file_being_written_is_seen_by_no_one_until_whole(open_store):
    store, other = await open_store(), await open_store()
    file = StoredFile(tenant="alice", purpose="batch", filename="out.jsonl")

    async def content() -> AsyncIterator[bytes]:
        yield b"x" * (2 * MIB + 10)
        assert len(await chunk_rows(store, file.id)) == 2
        for replica in (store, other):
            assert await replica.get_file("alice", file.id) is None
            assert await replica.list_files("alice", 10) == []
            assert not await replica.delete_file("alice", file.id)
        small.append(await put_file(other, b"y", quota_bytes=1))
        yield b"z"

    small: list[StoredFile] = []
    created = await store.create_file(file, content(), quota_bytes=2 * MIB + 12)
    assert await other.get_file("alice", file.id) == created
    assert {f.id for f in await other.list_files("alice", 10)} == {file.id, small[0].id}


async def test_a_file_whose_writer_failed_stays_hidden_until_retention_removes_it(store, clock):
    file = StoredFile(tenant="alice", purpose="batch_output", filename="out.jsonl")

    async def failing() -> AsyncIterator[bytes]:
        yield b"x" * (MIB + 1)
        raise ConnectionError("the results stopped coming")

    with pytest.raises(ConnectionError):
        await store.create_file(file, failing())
    assert await store.get_file("alice", file.id) is None
    assert await store.list_files("alice", 10) == []
    assert await chunk_rows(store, file.id) == [MIB]
    clock.advance(1)
    assert (await store.purge(clock.now(), 10)).files == 1
    assert await chunk_rows(store, file.id) == []


async def test_deleting_or_retiring_a_file_deletes_its_chunks(store, clock):
    deleted = await put_file(store, b"d" * (MIB + 1))
    retired = await put_file(store, b"r" * (MIB + 1))
    assert len(await chunk_rows(store, deleted.id)) == len(await chunk_rows(store, retired.id)) == 2
    assert await store.delete_file("alice", deleted.id)
    assert await chunk_rows(store, deleted.id) == []
    clock.advance(1)
    assert (await store.purge(clock.now(), 10)).files == 1
    assert await chunk_rows(store, retired.id) == []
    async with store._db.read() as session:
        assert await session.fetch("SELECT file_id FROM file_chunks") == []


async def test_an_upload_past_the_quota_keeps_none_of_its_chunks(store):
    file = StoredFile(tenant="alice", purpose="batch", filename="in.jsonl")
    with pytest.raises(StorageQuotaExceeded):
        await store.create_file(file, pieces(b"x" * (MIB + 1)), quota_bytes=MIB)
    assert await chunk_rows(store, file.id) == []
    assert await store.get_file("alice", file.id) is None


async def test_a_file_deleted_while_it_is_read_is_a_404(store):
    created = await put_file(store, b"x" * (2 * MIB))
    chunks = store.read_file(created)
    assert len(await anext(chunks)) == MIB
    await store.delete_file("alice", created.id)
    with pytest.raises(GatewayError) as gone:
        await anext(chunks)
    assert (gone.value.status, gone.value.code) == (404, "not_found")
    assert "deleted while it was read" in gone.value.message


async def test_a_file_is_read_only_by_its_tenant(store):
    created = await put_file(store, b"secret")
    with pytest.raises(GatewayError):
        await content_of(store, replace(created, tenant="bob"))


async def stored_bytes(store, tenant: str = "alice") -> int:
    """What the store counts against the tenant's quota, read as a refusal reports it."""
    with pytest.raises(StorageQuotaExceeded) as refused:
        await store.submit(job(tenant), quota_bytes=0)
    return refused.value.used


async def test_job_bodies_and_results_count_against_the_tenants_quota(store):
    quota = 3 * len(BODY) + 10
    kept = await store.submit(job(), quota_bytes=quota)
    await store.cancel("alice", (await store.submit(job(), quota_bytes=quota)).id)
    assert await stored_bytes(store) == 2 * len(BODY)
    with pytest.raises(StorageQuotaExceeded):
        await put_file(store, b"x" * (len(BODY) + 11), quota_bytes=quota)
    [claimed] = await store.claim("w", 30, 1)
    assert claimed.id == kept.id
    assert await store.finish("w", kept.id, JobState.SUCCEEDED, result=b"r" * 100)
    assert await stored_bytes(store) == 2 * len(BODY) + 100
    with pytest.raises(StorageQuotaExceeded):
        await store.submit(job(), quota_bytes=quota)
    again = await store.submit(replace(job(), id=kept.id), quota_bytes=quota)
    assert again.id == kept.id
    await store.submit(job("bob"), quota_bytes=quota)
    assert await stored_bytes(store, "bob") == len(BODY)


async def test_a_batch_counts_its_jobs_bodies_and_past_the_quota_stores_nothing(store):
    source = await put_file(store, b"{}\n" * 2)
    batch = Batch(
        tenant="alice",
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        status=BatchStatus.IN_PROGRESS,
        total_requests=2,
    )
    quota = 6 + 3 * len(BODY)
    await store.create_batch(batch, [job(custom_id=f"r{i}") for i in range(2)], quota)
    assert await stored_bytes(store) == 6 + 2 * len(BODY)
    second = replace(batch, id="batch_second")
    with pytest.raises(StorageQuotaExceeded):
        await store.create_batch(second, [job(custom_id=f"r{i}") for i in range(2)], quota)
    assert await store.get_batch("alice", second.id) is None
    assert sum((await store.batch_counts(second.id)).values()) == 0
    assert await stored_bytes(store) == 6 + 2 * len(BODY)


async def test_deleted_and_retired_rows_give_their_bytes_back(store, clock):
    done = await store.submit(job())
    await store.claim("w", 30, 1)
    await store.finish("w", done.id, JobState.SUCCEEDED, result=b"r" * 50)
    deleted, retired = await put_file(store, b"d" * 70), await put_file(store, b"f" * 30)
    await create_batch(store, lines=2)
    batch = (await store.list_batches("alice", 1))[0]
    await store.cancel_batch("alice", batch.id)
    await store.update_batch(
        replace(await store.get_batch("alice", batch.id), status=BatchStatus.CANCELLED),
        BatchStatus.CANCELLING,
    )
    assert await stored_bytes(store) == 3 * len(BODY) + 50 + 70 + 30 + 6
    assert await store.delete_file("alice", deleted.id)
    assert await stored_bytes(store) == 3 * len(BODY) + 50 + 30 + 6
    clock.advance(1)
    while any(await store.purge(clock.now(), 1)):
        pass
    assert await store.get_file("alice", retired.id) is None
    assert await stored_bytes(store) == 0


@pytest.fixture
async def version_2(request, open_store, tmp_path) -> AsyncIterator[Database]:
    async with schema_at(2, request, tmp_path) as db:
        yield db


@pytest.fixture
async def version_3(request, open_store, tmp_path) -> AsyncIterator[Database]:
    async with schema_at(3, request, tmp_path) as db:
        yield db


@asynccontextmanager
async def schema_at(version: int, request, tmp_path) -> AsyncIterator[Database]:
    """The database `open_store` opens, as a release of schema `version` left it."""
    if request.node.callspec.params["open_store"] == "sqlite":
        db: Database = await connect_sqlite(tmp_path / "jobs.db")
        setup: tuple[str, ...] = ()
    else:
        dsn, schema = (
            request.getfixturevalue("postgres_dsn"),
            request.getfixturevalue("postgres_schema"),
        )
        settings = {"search_path": schema}
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1, server_settings=settings)
        db, setup = PostgresDatabase(pool, None), (f"CREATE SCHEMA {schema}",)
    try:
        await migrate(db, 0.0, setup, [m for m in MIGRATIONS if m.version <= version])
        yield db
    finally:
        await db.close()


async def test_upgrading_to_version_4_counts_what_each_tenant_already_stores(version_3, open_store):
    async with version_3.write() as session:
        await session.fetch(
            """INSERT INTO files (id, tenant, purpose, filename, size, created_at)
            VALUES ('file-a', 'alice', 'batch', 'in.jsonl', 40, 1.0),
                ('file-partial', 'alice', 'batch', 'in.jsonl', NULL, 1.0)"""
        )
        for i, result in enumerate((b"r" * 9, None)):
            row = job_row(replace(job(), id=f"job-{i}", result=result, created_at=1.0))
            del row["request_id"]  # a column since version 5
            names = ", ".join(row)
            values = ", ".join(f":{name}" for name in row)
            await session.fetch(f"INSERT INTO jobs ({names}) VALUES ({values})", row)
    store = await open_store()
    assert await stored_bytes(store) == 40 + 2 * len(BODY) + 9
    assert await stored_bytes(store, "bob") == 0


async def test_upgrading_to_version_3_moves_each_files_content_into_chunks(version_2, open_store):
    content = bytes(range(256)) * (5 * MIB // 256 // 2)
    insert = """INSERT INTO files (id, tenant, purpose, filename, content, created_at)
        VALUES (:id, 'alice', 'batch', 'in.jsonl', :content, 1.0)"""
    async with version_2.write() as session:
        await session.fetch(insert, {"id": "file-big", "content": content})
        await session.fetch(insert, {"id": "file-empty", "content": b""})
    store = await open_store()
    big, empty = (
        await store.get_file("alice", "file-big"),
        await store.get_file("alice", "file-empty"),
    )
    assert (big.size, empty.size) == (len(content), 0)
    assert await chunk_rows(store, big.id) == [MIB, MIB, MIB // 2]
    assert await content_of(store, big) == content
    assert await content_of(store, empty) == b""
    assert {f.size for f in await store.list_files("alice", 10)} == {len(content), 0}
