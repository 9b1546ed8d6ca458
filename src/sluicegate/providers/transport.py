"""The HTTP side every adapter shares: a connection pool per deployment and one upstream call.

Adapters differ in URLs, headers, body shapes and error vocabularies; how a call is sent
within its budget, how the client's failures become `GatewayError`s and how long an
abandoned call keeps its permits do not, so they live here once. The client is the hot
path's own (`providers.upstream`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from sluicegate.core.errors import GatewayError
from sluicegate.core.ids import current
from sluicegate.core.types import Deployment
from sluicegate.providers.base import interrupted, malformed, timed_out, unreachable
from sluicegate.providers.upstream import Connection, Pool, header_lines, split

Classify = Callable[[str, int, bytes, Mapping[str, str]], GatewayError]
"""(deployment, status, body, headers) -> the error the caller should see."""


ERROR_BODY_BYTES = 64 * 1024
"""Enough of an error answer to name its cause; the rest is never read."""


class UpstreamBody:
    """A started upstream answer (status < 300), its read failures already normalised
    and its size bounded by the deployment's `max_response_bytes`."""

    __slots__ = ("_conn", "_deployment", "_limit", "ended", "handed_over")

    def __init__(self, conn: Connection, deployment: str, limit: int) -> None:
        self._conn = conn
        self._deployment = deployment
        self._limit = limit
        self.ended = False
        """True once the upstream itself finished or broke the response, not we."""
        self.handed_over = False
        """We end it to give its engine slot to another request (`providers.resume`)."""

    async def read(self) -> bytes:
        """The whole body; one over the bound is refused, not buffered."""
        parts: list[bytes] = []
        async for chunk in self.chunks():
            parts.append(chunk)
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The bytes as they arrive; judging whether the body is complete is the adapter's."""
        size, limit, read = 0, self._limit, self._conn.read
        try:
            while chunk := await read():
                size += len(chunk)
                if size > limit:
                    raise malformed(self._deployment, f"a body over {limit} bytes")
                yield chunk
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except Exception as exc:
            if isinstance(exc, GatewayError):
                raise
            self.ended = True
            raise interrupted(self._deployment, exc) from None
        self.ended = True

    async def error_text(self) -> bytes:
        """The start of an error answer (up to `ERROR_BODY_BYTES`), whatever its length."""
        parts: list[bytes] = []
        left = ERROR_BODY_BYTES
        try:
            while left > 0 and (part := await self._conn.read()):
                parts.append(part[:left])
                left -= len(part)
            return b"".join(parts)
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except Exception as exc:
            self.ended = True
            raise interrupted(self._deployment, exc) from None


def request_headers() -> dict[str, str] | None:
    """What the upstream learns of the request it serves: its id, so both sides' logs
    meet, and the caller's W3C trace context.

    The id goes with a suffix of its own per attempt: vLLM names the engine's request
    after it, and an engine refuses a request whose id is still running, which a
    caller's id sent twice, or an attempt retried while the engine still holds the one
    before, would be."""
    context = current.get()
    if context is None:
        return None
    headers = {"x-request-id": f"{context.request_id}-{os.urandom(4).hex()}"}
    if context.traceparent is not None:
        headers["traceparent"] = context.traceparent
        if context.tracestate is not None:
            headers["tracestate"] = context.tracestate
    return headers


class Transport:
    """One connection pool per deployment, so each has its own connection limit; each
    URL's request line and fixed headers are encoded once."""

    def __init__(self, deployment: Deployment, headers: Mapping[str, str]) -> None:
        self.deployment = deployment
        fixed = {"content-type": "application/json", "accept-encoding": "identity"}
        fixed.update(headers)
        self._fixed = header_lines(fixed)
        self._origin, _ = split(deployment.base_url)
        self._heads: dict[str, bytes] = {}
        self._pool: Pool | None = None
        t = deployment.timeouts
        self._total_s = t.total_s

    async def start(self) -> None:
        d = self.deployment
        self._pool = Pool(
            self._origin, d.max_connections, d.idle_connection_s, d.timeouts.connect_s
        )

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    @asynccontextmanager
    async def post(
        self, url: str, body: bytes, budget_s: float, classify: Classify, streamed: bool
    ) -> AsyncIterator[UpstreamBody]:
        """POST `body`, giving up after `budget_s` at most; an error status (a redirect
        included: none is followed) is raised as `classify` names it, and an answer that
        is not what a `streamed` (or not) request expects is malformed.

        The call has one deadline, from the budget and the deployment's `total_s`. A
        non-streamed answer's bytes come only once it is complete, so no read timeout
        applies to it: the pipeline bounds its wait by the output asked for; a stream's
        reads are each bounded by `read_s`.

        Closing the connection is all a client can do to stop an upstream call, and it
        proves nothing: an attempt abandoned mid-way (cancelled, timed out) keeps its
        caller's permits for `cancel_grace_s` more, the time a server takes to notice.
        One ended to hand its slot over does not: its successor is the very request the
        slot is for, and the engine holds it at most one step while it notices."""
        pool = self._pool
        assert pool is not None, "provider used before start()"
        name = self.deployment.name
        request = self._request(url, body)
        deadline = pool.loop.time() + min(budget_s, self._total_s)
        upstream: UpstreamBody | None = None
        ended = False
        try:
            try:
                conn = await pool.acquire(deadline)
            except TimeoutError:
                raise timed_out(name) from None
            except OSError as exc:
                ended = True
                raise unreachable(name, exc) from None
            try:
                conn.send(request, deadline, self.deployment.timeouts.read_s if streamed else None)
                try:
                    await conn.head()
                except TimeoutError:
                    raise timed_out(name) from None
                except Exception as exc:
                    ended = True
                    raise unreachable(name, exc) from None
                upstream = UpstreamBody(conn, name, self.deployment.max_response_bytes)
                if conn.status >= 300:
                    error = await upstream.error_text()
                    raise classify(name, conn.status, error, conn.headers)
                self._check(conn.headers, streamed)
                yield upstream
            finally:
                conn.finish()
                pool.release(conn)
        finally:
            if not (ended or (upstream is not None and (upstream.ended or upstream.handed_over))):
                await asyncio.sleep(self.deployment.cancel_grace_s)

    def _request(self, url: str, body: bytes) -> bytes:
        """The whole request: its URL's head, the call's own headers, the body."""
        head = self._heads.get(url)
        if head is None:
            origin, line = split(url)
            if origin != self._origin:
                raise ValueError(f"{url!r} is not at the deployment's origin")
            head = self._heads[url] = line + self._fixed
        extra = request_headers()
        own = b"" if extra is None else header_lines(extra)
        length = b"content-length: %d\r\n\r\n" % len(body)
        return b"".join((head, own, length, body))

    def _check(self, headers: Mapping[str, str], streamed: bool) -> None:
        """Refuse, before reading it, an answer that announces itself as something else:
        over the size bound, compressed although the gateway asked for identity, or a
        stream that is not an event stream."""
        name, limit = self.deployment.name, self.deployment.max_response_bytes
        length = headers.get("content-length")
        if length is not None and int(length) > limit:
            raise malformed(name, f"a Content-Length of {length}, over {limit} bytes")
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise malformed(name, f"a {encoding[:40]!r}-encoded body, not the identity asked for")
        if streamed:
            kind = headers.get("content-type", "application/octet-stream")
            kind = kind.partition(";")[0].strip().lower()
            if kind != "text/event-stream":
                raise malformed(name, f"a {kind[:80]!r} body to a stream request")


class AdapterResponse:
    """What every adapter's answer shares: the raw body, and the usage once reported."""

    __slots__ = ("_body", "_deployment", "cached_tokens", "completion_tokens", "used_tokens")

    def __init__(self, body: UpstreamBody, deployment: str) -> None:
        self._body = body
        self._deployment = deployment
        self.used_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None

    @property
    def ended(self) -> bool:
        """True once the upstream itself finished or broke the response, not we."""
        return self._body.ended

    def hand_over(self) -> None:
        self._body.handed_over = True


class HttpProvider:
    """What every HTTP adapter shares: its deployment and a started/closed transport."""

    def __init__(self, deployment: Deployment, headers: dict[str, str]) -> None:
        self.deployment = deployment
        self._transport = Transport(deployment, headers)

    async def start(self) -> None:
        await self._transport.start()

    async def close(self) -> None:
        await self._transport.close()
