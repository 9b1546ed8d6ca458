"""The job API: one request accepted for later, polled, listed and cancelled (MISSION 7).

`POST /v1/jobs` answers 202 only once the job is committed to the store, so an
acknowledged job survives a crash; a repeat of the same idempotency key gets the job
already stored, with 200.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import orjson

from sluicegate.api.asgi import (
    JSON_HEADERS,
    Receive,
    Router,
    Scope,
    Send,
    header,
    send_bytes,
    send_json,
)
from sluicegate.api.intake import Intake, endpoint_of, path_id, plain
from sluicegate.api.payloads import json_object
from sluicegate.core.errors import bad_request, not_found
from sluicegate.core.ids import request_id
from sluicegate.core.types import Tenant
from sluicegate.jobs.model import Job, JobState

PREFIX = "/v1/jobs/"
_FIELDS = frozenset(
    {
        "endpoint",
        "body",
        "deadline_s",
        "lane",
        "priority",
        "idempotency_key",
        "version_key",
        "version",
    }
)
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
_MAX_KEY = 256
_MAX_DEADLINE_S = 366 * 86_400.0
_DEFAULT_PAGE, _MAX_PAGE = 20, 100
_ENDED = {
    JobState.EXPIRED: ("expired", "the job's deadline passed before it could run"),
    JobState.CANCELLED: ("cancelled", "the job was cancelled"),
    JobState.SUPERSEDED: ("superseded", "a newer version of the job was submitted"),
}


class JobRoutes:
    def __init__(self, intake: Intake) -> None:
        self._intake = intake

    def routes(self, router: Router) -> Router:
        route = self._intake.route
        router.add("POST", "/v1/jobs", route(self._submit, submits=True))
        router.add("GET", "/v1/jobs", route(self._list))
        router.add_prefix("GET", PREFIX, route(self._get))
        router.add_prefix("DELETE", PREFIX, route(self._delete))
        router.add_prefix("POST", PREFIX, route(self._cancel))
        return router

    async def _submit(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        intake = self._intake
        spec = json_object(await intake.body(scope, receive, intake.settings.max_body_bytes))
        job = self._job(tenant, scope, spec)
        await intake.admit(tenant, 1)
        stored = await intake.store.submit(job, intake.policy.tenant_storage_max_bytes)
        fresh = stored.id == job.id
        if fresh:
            intake.accepted()
        headers = [*JSON_HEADERS, (b"location", f"{PREFIX}{stored.id}".encode())]
        await send_bytes(send, 202 if fresh else 200, orjson.dumps(document(stored)), headers)

    def _job(self, tenant: Tenant, scope: Scope, spec: dict[str, Any]) -> Job:
        unknown = sorted(spec.keys() - _FIELDS)
        if unknown:
            raise bad_request(f"unknown field {unknown[0]!r}")
        endpoint = endpoint_of(spec.get("endpoint"))
        version_key = _text(spec.get("version_key"), "version_key")
        version = _integer(spec, "version", 0, _INT64)
        if (version_key is None) != (version is None):
            raise bad_request("'version_key' and 'version' go together")
        intake = self._intake
        return Job(
            tenant=tenant.name,
            kind=endpoint,
            body=intake.request(tenant, endpoint, spec.get("body")),
            lane=intake.lane(spec.get("lane")),
            priority=_integer(spec, "priority", -_INT32, _INT32) or 0,
            deadline_at=intake.deadline_at(_seconds(spec, "deadline_s")),
            idempotency_key=_idempotency_key(scope, spec),
            version_key=version_key,
            version=version,
            request_id=request_id(),
        )

    async def _get(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        job_id = path_id(scope, PREFIX)
        await _answer(send, job_id, await self._intake.store.get(tenant.name, job_id))

    async def _delete(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        job_id = path_id(scope, PREFIX)
        await _answer(send, job_id, await self._intake.store.cancel(tenant.name, job_id))

    async def _cancel(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        job_id = path_id(scope, PREFIX, "/cancel")
        await _answer(send, job_id, await self._intake.store.cancel(tenant.name, job_id))

    async def _list(self, tenant: Tenant, scope: Scope, receive: Receive, send: Send) -> None:
        limit, after = page_query(scope)
        jobs = await self._intake.store.list_jobs(tenant.name, limit + 1, after)
        await send_json(send, 200, page_object([summary(job) for job in jobs], limit))


def page_query(scope: Scope) -> tuple[int, str | None]:
    """`limit` and `after` of a list route: newest first, a page at a time, `after` being
    the last id of the previous page. Any other parameter is refused, not ignored."""
    query = parse_qs(scope["query_string"].decode("latin-1"))
    unknown = sorted(query.keys() - {"limit", "after"})
    if unknown:
        raise bad_request(f"unknown query parameter {unknown[0]!r}")
    limit = _page_size(query.get("limit", [str(_DEFAULT_PAGE)])[-1])
    after = query.get("after", [None])[-1]
    return limit, None if after is None else plain(after, "after")


def page_object(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's cursor page, from up to `limit + 1` items (one more says there is more)."""
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def summary(job: Job) -> dict[str, Any]:
    """A job without its result, as lists show it."""
    return {
        "id": job.id,
        "object": "job",
        "endpoint": job.kind.path,
        "status": job.state.value,
        "lane": job.lane,
        "priority": job.priority,
        "attempts": job.attempts,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "deadline_at": job.deadline_at,
        "not_before": job.not_before,
        "cancel_requested": job.cancel_requested,
        "idempotency_key": job.idempotency_key,
        "version_key": job.version_key,
        "version": job.version,
        "batch_id": job.batch_id,
        "custom_id": job.custom_id,
        "request_id": job.request_id,
        "error": job_error(job),
        "last_error": None if job.state is JobState.FAILED else job.error,
    }


def document(job: Job) -> dict[str, Any]:
    """A job with its result: the upstream's answer, relayed as it was stored."""
    done = job.state is JobState.SUCCEEDED and job.result is not None
    return summary(job) | {"result": orjson.Fragment(job.result) if done else None}


def job_error(job: Job) -> dict[str, Any] | None:
    """Why a job ended without a result: its failure, or the state that ended it."""
    if job.state is JobState.FAILED:
        return job.error
    ended = _ENDED.get(job.state)
    return None if ended is None else {"code": ended[0], "message": ended[1]}


async def _answer(send: Send, job_id: str, job: Job | None) -> None:
    if job is None:
        raise not_found(f"no job {job_id!r}")
    await send_json(send, 200, document(job))


def _integer(spec: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = spec.get(name)
    if value is None or (type(value) is int and low <= value <= high):
        return value
    raise bad_request(f"'{name}' must be an integer from {low} to {high}")


def _text(value: Any, name: str) -> str | None:
    if value is None or (isinstance(value, str) and 0 < len(value) <= _MAX_KEY):
        return value if value is None else plain(value, name)
    raise bad_request(f"'{name}' must be a string of 1 to {_MAX_KEY} characters")


def _seconds(spec: dict[str, Any], name: str) -> float | None:
    value = spec.get(name)
    if value is None:
        return None
    if type(value) in (int, float) and 0 < value <= _MAX_DEADLINE_S:
        return float(value)
    raise bad_request(f"'{name}' must be a number of seconds, above 0 and at most a year")


def _idempotency_key(scope: Scope, spec: dict[str, Any]) -> str | None:
    """From the body or the `Idempotency-Key` header; both may be sent if they agree."""
    from_body = _text(spec.get("idempotency_key"), "idempotency_key")
    raw = header(scope, b"idempotency-key")
    if raw is None:
        return from_body
    from_header = _text(raw.decode("latin-1"), "Idempotency-Key")
    if from_body is not None and from_body != from_header:
        raise bad_request("the Idempotency-Key header and 'idempotency_key' differ")
    return from_header


def _page_size(text: str) -> int:
    """ASCII digits only: `str.isdigit` accepts '²', which `int` refuses."""
    if text.isascii() and text.isdigit() and 1 <= int(text) <= _MAX_PAGE:
        return int(text)
    raise bad_request(f"'limit' must be an integer from 1 to {_MAX_PAGE}")
