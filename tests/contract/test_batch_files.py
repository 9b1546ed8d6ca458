"""Batch result files and file downloads over every job store: a batch's results are read
a page at a time into the store's chunks, and a file goes to its client a chunk at a time.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

import orjson

from sluicegate.api.asgi import CONNECTION, Message, Router
from sluicegate.api.batches import BatchRoutes
from sluicegate.api.intake import Intake
from sluicegate.api.ledger import BatchLedger
from sluicegate.jobs.model import Batch, BatchStatus, StoredFile
from tests.config.test_config import ENV, base, parse
from tests.contract.test_job_store import MIB, chunk_rows, content_of
from tests.unit.jobs.test_batch_scale import running_batch

ANSWER_BYTES = 4096


def gateway(store, clock) -> tuple[Intake, Router]:
    intake = Intake(parse(base() | {"jobs": {}}), clock, lambda: None)
    intake.attach(store)
    return intake, BatchRoutes(intake, BatchLedger(intake)).routes(Router())


async def finished_batch(store, lines: int) -> Batch:
    """A batch of `lines` jobs, all succeeded with an answer of `ANSWER_BYTES`."""
    batch = await running_batch(store, lines)
    answer = orjson.dumps({"content": "a" * (ANSWER_BYTES - 14)})
    async with store._db.write() as session:
        await session.fetch(
            "UPDATE jobs SET state = 'succeeded', result = :result WHERE batch_id = :batch_id",
            {"result": answer, "batch_id": batch.id},
        )
    return batch


async def settling_peak(store, clock, lines: int) -> tuple[int, StoredFile]:
    """The bytes allocated at most at once while the batch's last poll finishes it."""
    intake, _ = gateway(store, clock)
    batch = await finished_batch(store, lines)
    tracemalloc.start()
    try:
        settled = await BatchLedger(intake).settle("alice", batch.id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (settled.status, settled.completed_requests) == (BatchStatus.COMPLETED, lines)
    return peak, await store.get_file("alice", settled.output_file_id)


async def test_finishing_a_batch_holds_a_page_of_results_not_its_output(store, clock):
    small_peak, small = await settling_peak(store, clock, 1_000)
    large_peak, large = await settling_peak(store, clock, 4_000)
    assert large.size > 4 * small.size * 0.99 > 16 * MIB
    assert large_peak < 1.5 * small_peak
    assert large_peak < large.size / 2
    lines = (await content_of(store, large)).splitlines()
    assert sorted(orjson.loads(line)["custom_id"] for line in lines) == sorted(
        f"r{i}" for i in range(4_000)
    )


async def get(router: Router, path: str, on_body=None) -> tuple[list[Message], bool]:
    """The messages a client is sent for `GET path`, and whether its connection was aborted;
    `on_body` runs as each body message is sent."""
    sent: list[Message] = []
    aborted = asyncio.Event()

    async def receive() -> Message:
        await aborted.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if on_body is not None and message["type"] == "http.response.body":
            await on_body()

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "headers": [(b"authorization", f"Bearer {ENV['ALICE_KEY']}".encode())],
        "extensions": {CONNECTION: Dropped(aborted)},
    }
    await router(scope, receive, send)
    return sent, aborted.is_set()


class Dropped:
    """The server's side of a connection (`asgi.Connection`) as far as a download uses it:
    whether it was aborted."""

    def __init__(self, aborted: asyncio.Event) -> None:
        self._aborted = aborted

    def read_within(self, timeout_s: float) -> None:
        """Downloads read no body."""

    def body_late(self) -> bool:
        return False

    def body_complete(self) -> bool:
        return True

    def bound_sends(self, left_s: float | None) -> None:
        """The server's write timeout is the download's bound."""

    def abort(self) -> None:
        self._aborted.set()


async def pieces(content: bytes) -> AsyncIterator[bytes]:
    yield content


async def test_a_download_is_sent_a_chunk_at_a_time_with_its_length(store, clock):
    _, router = gateway(store, clock)
    content = bytes(range(256)) * (10 * MIB // 256 // 4)
    file = StoredFile(tenant="alice", purpose="batch", filename="in.jsonl")
    created = await store.create_file(file, pieces(content))
    sent, aborted = await get(router, f"/v1/files/{created.id}/content")
    start, *bodies = sent
    assert (start["status"], dict(start["headers"])[b"content-length"]) == (200, b"2621440")
    assert [len(m["body"]) for m in bodies] == [MIB, MIB, MIB // 2, 0]
    assert [m.get("more_body", False) for m in bodies] == [True, True, True, False]
    assert b"".join(m["body"] for m in bodies) == content
    assert not aborted


async def test_a_file_deleted_during_its_download_aborts_the_connection(store, clock):
    _, router = gateway(store, clock)
    file = StoredFile(tenant="alice", purpose="batch", filename="in.jsonl")
    created = await store.create_file(file, pieces(b"x" * (3 * MIB)))

    async def delete() -> None:
        await store.delete_file("alice", created.id)

    sent, aborted = await get(router, f"/v1/files/{created.id}/content", delete)
    assert aborted
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200
    assert await chunk_rows(store, created.id) == []
