"""The HTTP side every adapter shares: a pooled session per deployment and one upstream call.

Adapters differ in URLs, headers, body shapes and error vocabularies; how a call is sent
within its budget, how aiohttp's failures become `GatewayError`s and how long an abandoned
call keeps its permits do not, so they live here once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

import aiohttp

from sluicegate.core.errors import GatewayError
from sluicegate.core.ids import current
from sluicegate.core.types import Deployment
from sluicegate.providers.base import interrupted, malformed, timed_out, unreachable

Classify = Callable[[str, int, bytes, Mapping[str, str]], GatewayError]
"""(deployment, status, body, headers) -> the error the caller should see."""


ERROR_BODY_BYTES = 64 * 1024
"""Enough of an error answer to name its cause; the rest is never read."""


class UpstreamBody:
    """A started upstream answer (status < 300), its read failures already normalised
    and its size bounded by the deployment's `max_response_bytes`."""

    __slots__ = ("_deployment", "_limit", "_response", "ended", "handed_over")

    def __init__(self, response: aiohttp.ClientResponse, deployment: str, limit: int) -> None:
        self._response = response
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
        size, limit = 0, self._limit
        try:
            async for chunk in self._response.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise malformed(self._deployment, f"a body over {limit} bytes")
                yield chunk
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except aiohttp.ClientError as exc:
            self.ended = True
            raise interrupted(self._deployment, exc) from None
        self.ended = True

    async def error_text(self) -> bytes:
        """The start of an error answer (up to `ERROR_BODY_BYTES`), whatever its length."""
        parts: list[bytes] = []
        left = ERROR_BODY_BYTES
        try:
            while left > 0 and (part := await self._response.content.read(left)):
                parts.append(part)
                left -= len(part)
            return b"".join(parts)
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except aiohttp.ClientError as exc:
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
    """One pooled aiohttp session per deployment, so each has its own connection limit."""

    def __init__(self, deployment: Deployment, headers: Mapping[str, str]) -> None:
        self.deployment = deployment
        self._headers = {"content-type": "application/json", "accept-encoding": "identity"}
        self._headers.update(headers)
        self._session: aiohttp.ClientSession | None = None
        t = deployment.timeouts
        self._timeout = aiohttp.ClientTimeout(
            total=t.total_s, connect=t.connect_s, sock_read=t.read_s
        )
        self._unread_timeout = aiohttp.ClientTimeout(total=t.total_s, connect=t.connect_s)
        """For a non-streamed answer, whose bytes all come at its end."""

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.deployment.max_connections,
            limit_per_host=0,
            keepalive_timeout=self.deployment.idle_connection_s,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            headers=self._headers,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @asynccontextmanager
    async def post(
        self, url: str, body: bytes, budget_s: float, classify: Classify, streamed: bool
    ) -> AsyncIterator[UpstreamBody]:
        """POST `body`, giving up after `budget_s` at most; an error status (a redirect
        included: none is followed) is raised as `classify` names it, and an answer that
        is not what a `streamed` (or not) request expects is malformed.

        A non-streamed answer's bytes come only once it is complete, so no read timeout
        applies to it: the pipeline bounds its wait by the output asked for.

        Closing the connection is all a client can do to stop an upstream call, and it
        proves nothing: an attempt abandoned mid-way (cancelled, timed out) keeps its
        caller's permits for `cancel_grace_s` more, the time a server takes to notice.
        One ended to hand its slot over does not: its successor is the very request the
        slot is for, and the engine holds it at most one step while it notices."""
        assert self._session is not None, "provider used before start()"
        name = self.deployment.name
        upstream: UpstreamBody | None = None
        ended = False
        try:
            try:
                response = await self._session.post(
                    url,
                    data=body,
                    timeout=self._timeout_within(budget_s, streamed),
                    allow_redirects=False,
                    headers=request_headers(),
                )
            except TimeoutError:
                raise timed_out(name) from None
            except aiohttp.ClientError as exc:
                ended = True
                raise unreachable(name, exc) from None
            async with response:
                upstream = UpstreamBody(response, name, self.deployment.max_response_bytes)
                if response.status >= 300:
                    error = await upstream.error_text()
                    raise classify(name, response.status, error, response.headers)
                self._check(response, streamed)
                yield upstream
        finally:
            if not (ended or (upstream is not None and (upstream.ended or upstream.handed_over))):
                await asyncio.sleep(self.deployment.cancel_grace_s)

    def _check(self, response: aiohttp.ClientResponse, streamed: bool) -> None:
        """Refuse, before reading it, an answer that announces itself as something else:
        over the size bound, compressed although the gateway asked for identity, or a
        stream that is not an event stream."""
        name, limit = self.deployment.name, self.deployment.max_response_bytes
        length = response.content_length
        if length is not None and length > limit:
            raise malformed(name, f"a Content-Length of {length}, over {limit} bytes")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise malformed(name, f"a {encoding[:40]!r}-encoded body, not the identity asked for")
        if streamed and response.content_type != "text/event-stream":
            raise malformed(name, f"a {response.content_type[:80]!r} body to a stream request")

    def _timeout_within(self, budget_s: float, streamed: bool) -> aiohttp.ClientTimeout:
        t = self._timeout if streamed else self._unread_timeout
        if t.total is not None and budget_s >= t.total:
            return t
        return aiohttp.ClientTimeout(total=budget_s, connect=t.connect, sock_read=t.sock_read)


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
