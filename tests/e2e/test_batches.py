"""OpenAI's files and batches flow through the official SDK, on the job store (MISSION 7)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator

import aiohttp
import openai
import orjson
import pytest

from tests.e2e.conftest import sim_stats
from tests.support.jobs import (
    CHAT,
    KEYS,
    ONE_AT_A_TIME,
    STORES,
    JobClient,
    chat,
    gateway_config,
    job_database,
    sqlite_jobs,
    start_gateway,
)
from tests.support.processes import Proc

database = pytest.fixture(params=STORES)(job_database)


@pytest.fixture
def gateway(sim, database, tmp_path) -> Iterator[Proc]:
    proc = start_gateway(tmp_path, gateway_config(sim, database.keys))
    yield proc
    proc.stop()


def client(gateway: Proc, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS[tenant], max_retries=0)


def jsonl(bodies: dict[str, dict], url: str = CHAT) -> io.BytesIO:
    lines = [
        orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})
        for custom_id, body in bodies.items()
    ]
    return io.BytesIO(b"\n".join(lines) + b"\n")


async def settled(sdk: openai.AsyncOpenAI, batch_id: str, timeout_s: float = 20.0):
    """Poll as the SDK's users do; there is nothing to wait on but the next answer."""
    async with asyncio.timeout(timeout_s):
        while True:
            batch = await sdk.batches.retrieve(batch_id)
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                return batch
            await asyncio.sleep(0.05)


async def lines(sdk: openai.AsyncOpenAI, file_id: str) -> list[dict]:
    content = await sdk.files.content(file_id)
    return [orjson.loads(line) for line in content.read().splitlines()]


async def test_the_sdk_batch_flow_completes_end_to_end(gateway):
    sdk = client(gateway, "alice")
    bodies = {f"r{i}": chat(max_tokens=3) for i in range(4)} | {"too-long": chat(40_000)}
    upload = await sdk.files.create(file=("in.jsonl", jsonl(bodies)), purpose="batch")
    assert (upload.purpose, upload.status) == ("batch", "processed")
    created = await sdk.batches.create(
        input_file_id=upload.id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"run": "e2e"},
    )
    assert (created.status, created.request_counts.total) == ("in_progress", 5)

    batch = await settled(sdk, created.id)
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (4, 1)
    assert batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.metadata == {"run": "e2e"}
    output = await lines(sdk, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == ["r0", "r1", "r2", "r3"]
    for line in output:
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["object"] == "chat.completion"
    [failed] = await lines(sdk, batch.error_file_id)
    assert (failed["custom_id"], failed["response"]["status_code"]) == ("too-long", 400)
    assert (await sdk.files.retrieve(batch.output_file_id)).purpose == "batch_output"


async def test_a_tenant_cannot_see_or_cancel_another_tenants_files_and_batches(gateway):
    alice, bob = client(gateway, "alice"), client(gateway, "bob")
    upload = await alice.files.create(file=("in.jsonl", jsonl({"a": chat()})), purpose="batch")
    batch = await alice.batches.create(
        input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
    )
    for attempt in (
        bob.files.retrieve(upload.id),
        bob.files.content(upload.id),
        bob.batches.retrieve(batch.id),
        bob.batches.cancel(batch.id),
        bob.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            await attempt
    assert (await settled(alice, batch.id)).status == "completed"


async def test_bad_lines_make_a_failed_batch_that_names_them(gateway):
    sdk = client(gateway, "bob")
    bodies = {"ok": chat(), "streamed": chat(stream=True), "private": chat(model="private")}
    upload = await sdk.files.create(file=("in.jsonl", jsonl(bodies)), purpose="batch")
    batch = await sdk.batches.create(
        input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
    )
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [
        (2, "invalid_request"),
        (3, "model_not_allowed"),
    ]
    with pytest.raises(openai.BadRequestError):
        await sdk.files.create(file=("in.jsonl", jsonl(bodies)), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError):
        await sdk.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="1h")


async def test_a_cancelled_batch_sends_nothing_more_and_ends_cancelled(sim, http, tmp_path):
    """One worker busy with a long job: the batch's requests wait, and its cancel ends
    them without a model call."""
    config = gateway_config(sim, sqlite_jobs(tmp_path, **ONE_AT_A_TIME))
    gateway = start_gateway(tmp_path, config)
    try:
        jobs, sdk = JobClient(http, gateway, "alice"), client(gateway, "alice")
        received = (await sim_stats(http, sim))["received"]
        blocker = await jobs.accepted(chat(max_tokens=200))
        await jobs.wait(blocker["id"], {"running"})
        upload = await sdk.files.create(
            file=("in.jsonl", jsonl({f"r{i}": chat() for i in range(3)})), purpose="batch"
        )
        batch = await sdk.batches.create(
            input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
        )
        cancelling = await sdk.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        ended = await settled(sdk, batch.id)
        assert (ended.status, ended.request_counts.failed, ended.output_file_id) == (
            "cancelled",
            3,
            None,
        )
        errors = await lines(sdk, ended.error_file_id)
        assert {line["error"]["code"] for line in errors} == {"cancelled"}
        await jobs.wait(blocker["id"], {"succeeded"})
        assert (await sim_stats(http, sim))["received"] - received == 1
    finally:
        gateway.stop()


async def test_the_sdk_lists_batches_and_files_page_by_page_and_deletes_files(gateway):
    sdk = client(gateway, "alice")
    uploads = [
        await sdk.files.create(file=(f"in{i}.jsonl", jsonl({"a": chat()})), purpose="batch")
        for i in range(3)
    ]
    batches = [
        await sdk.batches.create(input_file_id=u.id, endpoint=CHAT, completion_window="24h")
        for u in uploads
    ]
    for batch in batches:
        await settled(sdk, batch.id)

    listed = [b.id async for b in sdk.batches.list(limit=2)]
    assert listed == [b.id for b in reversed(batches)]
    first = await sdk.batches.list(limit=2)
    assert (len(first.data), first.has_more) == (2, True)
    files = [f async for f in sdk.files.list(limit=2)]
    assert {u.id for u in uploads} <= {f.id for f in files}
    assert all(f.object == "file" and f.bytes > 0 for f in files)
    assert [b.id async for b in client(gateway, "bob").batches.list()] == []

    deleted = await sdk.files.delete(uploads[0].id)
    assert (deleted.id, deleted.deleted) == (uploads[0].id, True)
    with pytest.raises(openai.NotFoundError):
        await sdk.files.retrieve(uploads[0].id)
    with pytest.raises(openai.NotFoundError):
        await client(gateway, "bob").files.delete(uploads[1].id)
    assert uploads[0].id not in {f.id async for f in sdk.files.list()}


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/files", "/v1/batches"])
@pytest.mark.parametrize("query", ["limit=²", "limit=0", "limit=101", "limit=x", "order=asc"])
async def test_a_bad_list_parameter_is_a_400_in_openais_shape(gateway, http, path, query):
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    async with http.get(f"{gateway.url}{path}?{query}", headers=headers) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")


async def test_control_characters_in_what_the_gateway_stores_are_a_400(gateway, http):
    """PostgreSQL refuses a NUL in text, which ended a submit in a 500 with a traceback;
    no control character is stored (or looked up) anywhere, on either store."""
    sdk = client(gateway, "alice")
    upload = await sdk.files.create(file=jsonl({"r1": chat()}), purpose="batch")
    batch = {"endpoint": CHAT, "completion_window": "24h", "input_file_id": upload.id}
    refused = {
        "/v1/jobs": [
            {"endpoint": CHAT, "body": chat(), "idempotency_key": "order\x007"},
            {"endpoint": CHAT, "body": chat(), "version_key": "v\x1b", "version": 1},
        ],
        "/v1/batches": [
            batch | {"metadata": {"owner": "ops\x00"}},
            batch | {"metadata": {"own\x7fer": "ops"}},
        ],
    }
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    for path, specs in refused.items():
        for spec in specs:
            async with http.post(f"{gateway.url}{path}", json=spec, headers=headers) as resp:
                assert resp.status == 400, (spec, await resp.text())
                assert "control characters" in (await resp.json())["error"]["message"]
    for query, status in (
        ("/v1/jobs/job%00", 404),
        ("/v1/files/file%00", 404),
        ("/v1/batches?after=batch%00", 400),
    ):
        async with http.get(f"{gateway.url}{query}", headers=headers) as resp:
            assert resp.status == status, (query, await resp.text())
    missing = batch | {"input_file_id": "file\x00"}
    async with http.post(f"{gateway.url}/v1/batches", json=missing, headers=headers) as resp:
        assert resp.status == 404, await resp.text()
    form = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in\x07put.jsonl"\r\n'
        b"\r\n{}\n\r\n--b--\r\n"
    )
    sent = headers | {"Content-Type": "multipart/form-data; boundary=b"}
    async with http.post(f"{gateway.url}/v1/files", data=form, headers=sent) as resp:
        assert resp.status == 400, await resp.text()
        assert "'filename' must not contain control characters" in await resp.text()
    lines_in = await sdk.files.create(file=jsonl({"r\x001": chat()}), purpose="batch")
    failed = await sdk.batches.create(
        input_file_id=lines_in.id, endpoint=CHAT, completion_window="24h"
    )
    assert failed.status == "failed"
    assert "control characters" in failed.errors.data[0].message


async def test_an_upload_past_the_tenants_storage_quota_is_refused(sim, tmp_path):
    quota = {"tenant_storage_max_bytes": 2048}
    gateway = start_gateway(tmp_path, gateway_config(sim, sqlite_jobs(tmp_path, **quota)))
    try:
        sdk = client(gateway, "alice")
        big = {f"r{i}": chat() for i in range(12)}
        first = await sdk.files.create(file=("a.jsonl", jsonl(big)), purpose="batch")
        with pytest.raises(openai.RateLimitError) as refused:
            await sdk.files.create(file=("b.jsonl", jsonl(big)), purpose="batch")
        assert refused.value.code == "storage_quota_exceeded"
        await sdk.files.delete(first.id)
        await sdk.files.create(file=("b.jsonl", jsonl(big)), purpose="batch")
    finally:
        gateway.stop()


async def churned(sdk: openai.AsyncOpenAI, file_id: str, rounds: int = 40) -> str | None:
    """Create and cancel batches from one file until one is refused: the refusal's code."""
    for _ in range(rounds):
        try:
            batch = await sdk.batches.create(
                input_file_id=file_id, endpoint=CHAT, completion_window="24h"
            )
        except openai.RateLimitError as err:
            return err.code
        await sdk.batches.cancel(batch.id)
    return None


async def test_cancelled_jobs_and_batches_copied_from_one_file_count_against_the_quota(
    sim, tmp_path
):
    """Storage churned by cancelling what was just stored runs into the quota: every job
    body and every batch's copy of its file is kept until retention, and counted."""
    jobs = sqlite_jobs(tmp_path, tenant_storage_max_bytes=4096)
    gateway = start_gateway(tmp_path, gateway_config(sim, jobs))
    try:
        sdk = client(gateway, "alice")
        upload = await sdk.files.create(file=("a.jsonl", jsonl({"r": chat()})), purpose="batch")
        assert await churned(sdk, upload.id) == "storage_quota_exceeded"
        async with aiohttp.ClientSession() as http:
            status, _, body = await JobClient(http, gateway, "alice").submit()
            assert (status, body["error"]["code"]) == (429, "storage_quota_exceeded")
            status, _, _ = await JobClient(http, gateway, "bob").submit()
            assert status == 202
    finally:
        gateway.stop()


async def test_a_file_over_50000_requests_fails_on_its_count_before_any_line_is_parsed(gateway):
    sdk = client(gateway, "alice")
    oversized = io.BytesIO(b"not json\n" * 50_001)
    upload = await sdk.files.create(file=("big.jsonl", oversized), purpose="batch")
    batch = await sdk.batches.create(
        input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
    )
    assert batch.status == "failed"
    [error] = batch.errors.data
    assert (error.line, error.code) == (None, "invalid_request")
    assert error.message == "the input file holds more than 50000 requests"
    empty = await sdk.files.create(file=("empty.jsonl", io.BytesIO(b"\n\n")), purpose="batch")
    batch = await sdk.batches.create(input_file_id=empty.id, endpoint=CHAT, completion_window="24h")
    assert batch.errors.data[0].message == "the input file holds no requests"
