"""Accepting work for later: what the job, file and batch routes share.

A request is checked as its synchronous route would check it (body, model, the tenant's
allow-list) and the backlog bounds are applied before anything is stored. These routes
touch only the job store, never a pool or a queue, so they answer while the models are
saturated. Their bodies (uploads up to `max_file_bytes`) are read within the server's
body deadline, and a tenant holds at most `tenant_max_concurrency` of their requests at
once, so slow uploads pin neither memory nor connections beyond the tenant's share.
What stores something (a job, an upload, a batch) is also paced per tenant, so storage
cannot be churned faster than `tenant_submissions_per_minute`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from sluicegate.api.asgi import (
    ClientDisconnected,
    Handler,
    Receive,
    Scope,
    Send,
    body_unread,
    read_body_within,
    send_error,
    shown,
)
from sluicegate.api.auth import Authenticator
from sluicegate.api.payloads import parse
from sluicegate.core.clock import Clock
from sluicegate.core.errors import ErrorType, GatewayError, bad_request, not_found
from sluicegate.core.limits import Rate, gcra
from sluicegate.core.refusals import Refusal
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

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        on_accepted: Callable[[], None],
        pace_clock: Clock | None = None,
    ) -> None:
        """`clock` gives the jobs' times (unix seconds); `pace_clock`, a steady clock
        for the submission rates (`clock` if not given)."""
        self.settings = settings
        self.policy = settings.jobs
        self.clock = clock
        self._authenticate = Authenticator(settings.keys)
        self._on_accepted = on_accepted
        self._store: JobStore | None = None
        self._held = TenantSlots(self.policy.tenant_max_concurrency)
        self._paced = Submissions(self.policy.tenant_submissions_per_minute, pace_clock or clock)

    def attach(self, store: JobStore | None) -> None:
        self._store = store

    @property
    def store(self) -> JobStore:
        if not self.policy.enabled:
            raise GatewayError(
                404,
                "jobs_not_configured",
                "this gateway keeps no jobs, files or batches: its config has no 'jobs' section",
                ErrorType.INVALID_REQUEST,
            )
        if self._store is None:
            raise GatewayError(
                503, "job_store_unavailable", "the job store is not open", ErrorType.UNAVAILABLE
            )
        return self._store

    def accepted(self) -> None:
        """New jobs are stored: wake this process's claimer rather than wait for its poll."""
        self._on_accepted()

    def route(self, handler: TenantHandler, *, submits: bool = False) -> Handler:
        """An ASGI handler that authenticates, takes one of the tenant's slots and, for a
        route that `submits`, one of its submissions, then answers any failure in
        OpenAI's shape, closing a connection whose body is unread."""

        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                tenant = self._authenticate(scope)
                if submits:
                    self._paced.take(tenant.name)
                with self._held.hold(tenant.name):
                    await handler(tenant, scope, receive, send)
            except GatewayError as err:
                await send_error(send, err, close=body_unread(scope))
            except ClientDisconnected:
                pass
            except Exception:
                log.exception("unexpected failure on %s %s", scope["method"], shown(scope["path"]))
                await send_error(send, _internal())

        return handle

    async def body(
        self,
        scope: Scope,
        receive: Receive,
        limit: int,
        into: Callable[[bytes], None] | None = None,
    ) -> bytes:
        """The request's body, due within the server's body deadline."""
        timeout_s = self.settings.edge.body_timeout_s
        return await read_body_within(scope, receive, limit, timeout_s, into)

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


class TenantSlots:
    """At most `limit` requests of each tenant at once (None: no bound), in this process,
    refused at once with a 429 and no Retry-After: a count of requests in flight knows no
    time at which one will end."""

    def __init__(self, limit: int | None) -> None:
        self._limit = limit
        self._held: dict[str, int] = {}

    @contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        held = self._held.get(tenant, 0)
        if self._limit is not None and held >= self._limit:
            raise Refusal.TENANT_CONCURRENCY.error(
                f"tenant {tenant} has {held} job, file and batch requests open; "
                f"its limit is {self._limit}"
            )
        self._held[tenant] = held + 1
        try:
            yield
        finally:
            left = self._held[tenant] - 1
            if left:
                self._held[tenant] = left
            else:
                del self._held[tenant]


class Submissions:
    """Each tenant's submissions per minute in this process, a minute's worth at once
    (GCRA; None: no bound), refused with a 429 whose Retry-After is when the next one
    may pass."""

    def __init__(self, per_minute: float | None, clock: Clock) -> None:
        self._rate = None if per_minute is None else Rate(per_minute, 60.0, per_minute)
        self._clock = clock
        self._tats: dict[str, float] = {}

    def take(self, tenant: str) -> None:
        rate = self._rate
        if rate is None:
            return
        now = self._clock.now()
        decision, self._tats[tenant] = gcra(self._tats.get(tenant, now), now, rate, 1)
        if not decision.allowed:
            raise Refusal.TENANT_RATE.error(
                f"tenant {tenant} is over its limit of {rate.limit:g} job, file and batch "
                "submissions per minute",
                decision.retry_after_s,
            )


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
