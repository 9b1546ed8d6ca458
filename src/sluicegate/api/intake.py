"""Accepting work for later: what the job, file and batch routes share.

A request is checked as its synchronous route would check it (body, model, the tenant's
allow-list) and the backlog bounds are applied before anything is stored. These routes
touch only the job store, never a pool or a queue, so they answer while the models are
saturated.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from sluicegate.api.asgi import (
    ClientDisconnected,
    Handler,
    Receive,
    Scope,
    Send,
    send_error,
    shown,
)
from sluicegate.api.auth import Authenticator
from sluicegate.api.payloads import parse
from sluicegate.core.clock import Clock
from sluicegate.core.errors import ErrorType, GatewayError, bad_request, not_found
from sluicegate.core.types import Endpoint, Settings, Tenant
from sluicegate.jobs.store import JobStore

log = logging.getLogger("sluicegate.jobs")

BACKLOG_FULL = "job_backlog_full"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters and DEL: PostgreSQL refuses NUL in text, and the others
would reach listings, files and logs as they came."""
_ENDPOINTS = {endpoint.path: endpoint for endpoint in Endpoint}

TenantHandler = Callable[[Tenant, Scope, Receive, Send], Awaitable[None]]


class Intake:
    """The job store as the HTTP routes see it, with the checks that come before a submit.

    The store is opened at startup and attached then; until it is (and once shutdown has
    begun) the routes answer 503 rather than fail.
    """

    def __init__(self, settings: Settings, clock: Clock, on_accepted: Callable[[], None]) -> None:
        self.settings = settings
        self.policy = settings.jobs
        self.clock = clock
        self._authenticate = Authenticator(settings.keys)
        self._on_accepted = on_accepted
        self._store: JobStore | None = None

    def attach(self, store: JobStore | None) -> None:
        self._store = store

    @property
    def store(self) -> JobStore:
        if self._store is None:
            raise GatewayError(
                503, "job_store_unavailable", "the job store is not open", ErrorType.UNAVAILABLE
            )
        return self._store

    def accepted(self) -> None:
        """New jobs are stored: wake this process's claimer rather than wait for its poll."""
        self._on_accepted()

    def route(self, handler: TenantHandler) -> Handler:
        """An ASGI handler that authenticates, then answers any failure in OpenAI's shape."""

        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                await handler(self._authenticate(scope), scope, receive, send)
            except GatewayError as err:
                await send_error(send, err)
            except ClientDisconnected:
                pass
            except Exception:
                log.exception("unexpected failure on %s %s", scope["method"], shown(scope["path"]))
                await send_error(send, _internal())

        return handle

    def request(self, tenant: Tenant, endpoint: Endpoint, body: Any) -> bytes:
        """The body a job will send, checked as its route checks it; never streamed."""
        if not isinstance(body, dict):
            raise bad_request("'body' must be the request, a JSON object")
        raw = orjson.dumps(body)
        payload = parse(endpoint, raw, self.settings.routes[endpoint].max_messages)
        if payload.get("stream"):
            raise bad_request("a job's answer is stored, not streamed: leave 'stream' unset")
        self.settings.model_for(tenant, payload["model"])
        return raw

    def lane(self, name: Any) -> str:
        """The lane a job asked for, else the bottom lane: jobs run when others are idle."""
        scheduling = self.settings.scheduling
        if name is None:
            return scheduling.bottom.name
        if not isinstance(name, str) or scheduling.lane(name) is None:
            raise bad_request(f"unknown lane {name!r}", "unknown_lane")
        return name

    def deadline_at(self, deadline_s: float | None) -> float:
        return self.clock.now() + (deadline_s or self.policy.default_deadline_s)

    async def admit(self, tenant: Tenant, count: int) -> None:
        """Refuse `count` more jobs when the tenant's or the whole backlog is full.

        The counts are read, not reserved, so submissions racing each other may pass a
        bound by as many as arrive at once.
        """
        policy, store = self.policy, self.store
        if policy.tenant_backlog_max is not None:
            mine = await store.backlog(tenant=tenant.name)
            if mine.size + count > policy.tenant_backlog_max:
                raise _backlog_full(
                    429,
                    f"tenant {tenant.name} has {mine.size} jobs queued; "
                    f"its limit is {policy.tenant_backlog_max}",
                )
        if policy.backlog_max is None and policy.backlog_max_age_s is None:
            return
        every = await store.backlog()
        if policy.backlog_max is not None and every.size + count > policy.backlog_max:
            raise _backlog_full(
                503, f"{every.size} jobs are queued; the gateway holds at most {policy.backlog_max}"
            )
        if policy.backlog_max_age_s is not None and every.oldest_age_s > policy.backlog_max_age_s:
            raise _backlog_full(
                503,
                f"the oldest queued job has waited {every.oldest_age_s:.0f}s, "
                f"longer than the {policy.backlog_max_age_s:g}s the backlog allows",
            )


def plain(text: str, name: str) -> str:
    """`text`, a caller's string the gateway stores, refused if it holds a control
    character."""
    if _CONTROL.search(text):
        raise bad_request(f"'{name}' must not contain control characters")
    return text


def storable(text: str) -> bool:
    """Whether `text` could name something stored: an id looked up that could not be
    stored is not found without asking the store."""
    return _CONTROL.search(text) is None


def endpoint_of(path: Any) -> Endpoint:
    endpoint = _ENDPOINTS.get(path) if isinstance(path, str) else None
    if endpoint is None:
        raise bad_request(f"'endpoint' must be one of {', '.join(_ENDPOINTS)}")
    return endpoint


def path_id(scope: Scope, prefix: str, suffix: str = "") -> str:
    """The id in `{prefix}{id}{suffix}`; a 404 for any other path under the prefix."""
    rest = scope["path"].removeprefix(prefix)
    if suffix:
        rest = rest.removesuffix(suffix) if rest.endswith(suffix) else ""
    if not rest or "/" in rest or not storable(rest):
        raise not_found(f"no route {shown(scope['path'])}", "unknown_route")
    return rest


def _backlog_full(status: int, message: str) -> GatewayError:
    kind = ErrorType.RATE_LIMIT if status == 429 else ErrorType.UNAVAILABLE
    return GatewayError(status, BACKLOG_FULL, f"job backlog full: {message}", kind)


def _internal() -> GatewayError:
    return GatewayError(500, "internal_error", "the job API failed", ErrorType.INTERNAL)
