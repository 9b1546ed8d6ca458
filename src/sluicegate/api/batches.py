"""OpenAI's Files and Batch APIs on the job store, so the `openai` SDK's batch flow works
unchanged: upload a JSONL file, create a batch from it, poll it, download its results.

Every line of the input is checked, as its route would check it, before anything is
stored; then the batch and one job per line are stored in one transaction. A file with
bad lines makes a `failed` batch listing them, as OpenAI does. Uploads are parsed as
they arrive and input files read a line at a time, so neither costs more than a copy
of its size; the request count is checked while reading. A file's content is sent as
the store keeps it, a chunk at a time.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from sluicegate.api.asgi import (
    CONNECTION,
    Connection,
    DisconnectWatcher,
    Receive,
    Router,
    Scope,
    Send,
    header,
    send_json,
)
from sluicegate.api.intake import Intake, endpoint_of, path_id, plain, storable
from sluicegate.api.jobs import page_object, page_query
from sluicegate.api.ledger import BatchLedger
from sluicegate.api.multipart import FormReader
from sluicegate.api.payloads import json_object
from sluicegate.core.errors import GatewayError, bad_request, not_found
from sluicegate.core.ids import request_id
from sluicegate.core.types import Endpoint, Tenant
from sluicegate.jobs.model import Batch, BatchStatus, Job, StoredFile

log = logging.getLogger("sluicegate.jobs")

FILES, BATCHES = "/v1/files/", "/v1/batches/"
INPUT_PURPOSE = "batch"
WINDOW, WINDOW_S = "24h", 86_400.0
MAX_REQUESTS = 50_000
"""OpenAI's own limit of requests per batch."""
_MAX_LINE_ERRORS = 20
_MAX_METADATA = 16


class BatchRoutes:
    def __init__(self, intake: Intake, ledger: BatchLedger) -> None:
        self._intake = intake
        self._ledger = ledger

    def routes(self, router: Router) -> Router:
        route = self._intake.route
        router.add("POST", "/v1/files", route(self._upload, submits=True))
        router.add("GET", "/v1/files", route(self._files))
        router.add_prefix("GET", FILES, route(self._file))
        router.add_prefix("DELETE", FILES, route(self._delete_file))
        router.add("POST", "/v1/batches", route(self._create, submits=True))
        router.add("GET", "/v1/batches", route(self._batches))
        router.add_prefix("GET", BATCHES, route(self._get))
        router.add_prefix("POST", BATCHES, route(self._cancel))
        return router

    async def _upload(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        intake = self._intake
        reader = FormReader(header(scope, b"content-type") or b"")
        await intake.body(scope, receive, intake.policy.max_file_bytes, reader.feed)
        form = reader.fields()
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose is None or purpose.content != INPUT_PURPOSE.encode():
            raise bad_request(f"'purpose' must be {INPUT_PURPOSE!r}: files here are batch input")
        if upload is None or not upload.filename:
            raise bad_request("'file' must be a file")
        filename = plain(upload.filename, "filename")
        file = StoredFile(tenant=tenant.name, purpose=INPUT_PURPOSE, filename=filename)
        quota = intake.policy.tenant_storage_max_bytes
        stored = await intake.store.create_file(file, _each(upload.chunks), quota)
        await send_json(send, 200, file_object(stored))

    async def _files(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        limit, after = page_query(scope)
        files = await self._intake.store.list_files(tenant.name, limit + 1, after)
        await send_json(send, 200, page_object([file_object(file) for file in files], limit))

    async def _delete_file(
        self, tenant: Tenant, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """OpenAI's `FileDeleted`. A batch keeps its jobs' results when its files go."""
        file_id = path_id(scope, FILES)
        if not await self._intake.store.delete_file(tenant.name, file_id):
            raise not_found(f"no file {file_id!r}")
        await send_json(send, 200, {"id": file_id, "object": "file", "deleted": True})

    async def _batches(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        """Newest first, as stored: a batch's counts are settled when it is read by id."""
        limit, after = page_query(scope)
        batches = await self._intake.store.list_batches(tenant.name, limit + 1, after)
        await send_json(send, 200, page_object([batch_object(b) for b in batches], limit))

    async def _file(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        """`GET /v1/files/{id}` (the file object) or `.../content` (its bytes)."""
        content = scope["path"].endswith("/content")
        file_id = path_id(scope, FILES, "/content" if content else "")
        file = await self._intake.store.get_file(tenant.name, file_id)
        if file is None:
            raise not_found(f"no file {file_id!r}")
        if content:
            await self._send_content(scope, receive, send, file)
        else:
            await send_json(send, 200, file_object(file))

    async def _send_content(
        self, scope: Scope, receive: Receive, send: Send, file: StoredFile
    ) -> None:
        """A chunk read, then sent, at a time, with the file's length declared. The first
        chunk is read before the answer starts, so a store or file gone by then is an
        ordinary error; one gone later aborts the connection, and the length shows the
        client its body was cut short. A client that leaves ends it; one that stops reading
        is aborted by the server after its write timeout."""
        chunks = self._intake.store.read_file(file)
        first = await anext(chunks, b"")
        headers = [
            (b"content-type", b"application/jsonl"),
            (b"content-length", str(file.size).encode()),
        ]
        try:
            async with DisconnectWatcher(receive):
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": first, "more_body": True})
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except GatewayError as err:
            log.warning("download of %s cut short: %s", file.id, err.message)
            connection: Connection | None = scope.get("extensions", {}).get(CONNECTION)
            if connection is not None:
                connection.abort()
            return
        await send({"type": "http.response.body", "body": b""})

    async def _create(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        intake = self._intake
        spec = json_object(await intake.body(scope, receive, intake.settings.max_body_bytes))
        endpoint = endpoint_of(spec.get("endpoint"))
        if spec.get("completion_window") != WINDOW:
            raise bad_request(f"'completion_window' must be {WINDOW!r}")
        source_id = spec.get("input_file_id")
        if not isinstance(source_id, str):
            raise bad_request("'input_file_id' must be the id of an uploaded file")
        source = (
            await intake.store.get_file(tenant.name, source_id) if storable(source_id) else None
        )
        if source is None or source.purpose != INPUT_PURPOSE:
            raise not_found(f"no batch input file {source_id!r}")
        batch = Batch(
            tenant=tenant.name,
            input_file_id=source.id,
            endpoint=endpoint.path,
            completion_window=WINDOW,
            metadata=_metadata(spec.get("metadata")),
        )
        content = [chunk async for chunk in intake.store.read_file(source)]
        checked = await asyncio.to_thread(read_requests, intake, tenant, endpoint, content)
        if isinstance(checked, list):
            failed = replace(batch, status=BatchStatus.FAILED, errors=checked)
            stored = await intake.store.create_batch(failed, [])
        else:
            stored = await self._start(tenant, endpoint, batch, checked)
        await send_json(send, 200, batch_object(stored))

    async def _start(
        self, tenant: Tenant, endpoint: Endpoint, batch: Batch, requests: dict[str, bytes]
    ) -> Batch:
        """The jobs are made as they are inserted, a statement's worth at a time."""
        intake = self._intake
        await intake.admit(tenant, len(requests))
        deadline = intake.clock.now() + WINDOW_S
        lane = intake.lane(None)
        rid = request_id()
        jobs = (
            Job(
                tenant=tenant.name,
                kind=endpoint,
                body=body,
                lane=lane,
                deadline_at=deadline,
                custom_id=custom_id,
                request_id=rid,
            )
            for custom_id, body in requests.items()
        )
        running = replace(
            batch,
            status=BatchStatus.IN_PROGRESS,
            total_requests=len(requests),
            expires_at=deadline,
        )
        quota = intake.policy.tenant_storage_max_bytes
        stored = await intake.store.create_batch(running, jobs, quota)
        intake.accepted()
        return stored

    async def _get(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        batch_id = path_id(scope, BATCHES)
        await _answer(send, batch_id, await self._ledger.settle(tenant.name, batch_id))

    async def _cancel(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        batch_id = path_id(scope, BATCHES, "/cancel")
        if await self._intake.store.cancel_batch(tenant.name, batch_id) is None:
            raise not_found(f"no batch {batch_id!r}")
        await _answer(send, batch_id, await self._ledger.settle(tenant.name, batch_id))


def read_requests(
    intake: Intake, tenant: Tenant, endpoint: Endpoint, content: Sequence[bytes]
) -> dict[str, bytes] | list[dict[str, Any]]:
    """The bodies of an input file's requests by custom_id, or the errors of its lines.

    The requests are counted first, without parsing, stopping at the first one too many,
    so an oversized file is refused before any of it is parsed."""
    count = sum(1 for _ in itertools.islice(_lines(content), MAX_REQUESTS + 1))
    if not 0 < count <= MAX_REQUESTS:
        found = f"more than {MAX_REQUESTS}" if count else "no"
        return [_line_error(None, bad_request(f"the input file holds {found} requests"))]
    requests: dict[str, bytes] = {}
    errors: list[dict[str, Any]] = []
    for number, line in _lines(content):
        try:
            custom_id, body = _request(intake, tenant, endpoint, line)
            if custom_id in requests:
                raise bad_request(f"custom_id {custom_id!r} is used twice", "duplicate_custom_id")
        except GatewayError as err:
            errors.append(_line_error(number, err))
            if len(errors) == _MAX_LINE_ERRORS:
                break
            continue
        requests[custom_id] = body
    return errors or requests


def _lines(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of a file's `chunks` with their numbers, one at a time; a line
    may span chunks."""
    number, pieces = 0, list[bytes]()
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start) + 1) > 0:
            pieces.append(chunk[start:end])
            start = end
            number += 1
            line = b"".join(pieces)
            pieces.clear()
            if line.strip():
                yield number, line
        if start < len(chunk):
            pieces.append(chunk[start:])
    line = b"".join(pieces)
    if line.strip():
        yield number + 1, line


async def _each(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _request(intake: Intake, tenant: Tenant, endpoint: Endpoint, line: bytes) -> tuple[str, bytes]:
    item = json_object(line)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise bad_request("'custom_id' must be a non-empty string")
    plain(custom_id, "custom_id")
    if item.get("method") != "POST":
        raise bad_request("'method' must be 'POST'")
    if item.get("url") != endpoint.path:
        raise bad_request(f"'url' must be the batch's endpoint {endpoint.path}")
    body = intake.request(tenant, endpoint, item.get("body"))
    # orjson's bytes keep its whole write buffer (4 KiB for a 100-byte body); a batch
    # holds 50,000 of them until they are stored, so keep a copy of just the body.
    return custom_id, memoryview(body).tobytes()


def _line_error(number: int | None, err: GatewayError) -> dict[str, Any]:
    return {"code": err.code, "message": err.message, "line": number, "param": err.param}


def _metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's rule: at most 16 string pairs, keys up to 64 and values up to 512 characters."""
    if value is None:
        return None
    if (
        isinstance(value, dict)
        and len(value) <= _MAX_METADATA
        and all(isinstance(k, str) and len(k) <= 64 for k in value)
        and all(isinstance(v, str) and len(v) <= 512 for v in value.values())
    ):
        for key, text in value.items():
            plain(key, "metadata")
            plain(text, "metadata")
        return value
    raise bad_request("'metadata' must map at most 16 keys (64 characters) to strings (512)")


async def _answer(send: Send, batch_id: str, batch: Batch | None) -> None:
    if batch is None:
        raise not_found(f"no batch {batch_id!r}")
    await send_json(send, 200, batch_object(batch))


def file_object(file: StoredFile) -> dict[str, Any]:
    """OpenAI's `FileObject`."""
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.size,
        "created_at": int(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def batch_object(batch: Batch) -> dict[str, Any]:
    """OpenAI's `Batch`: each status entered gives its `{status}_at` time."""
    times = {f"{status}_at": int(at) for status, at in batch.status_at.items()}
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status.value,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "expires_at": None if batch.expires_at is None else int(batch.expires_at),
        "request_counts": {
            "total": batch.total_requests,
            "completed": batch.completed_requests,
            "failed": batch.failed_requests,
        },
        "metadata": batch.metadata,
        **times,
    }
