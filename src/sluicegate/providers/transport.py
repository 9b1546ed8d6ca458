"""The HTTP side every adapter shares: a pooled session per deployment and one upstream call.

Adapters differ in URLs, headers, body shapes and error vocabularies; how a call is sent
within its budget, how aiohttp's failures become `GatewayError`s and how long an abandoned
call keeps its permits do not, so they live here once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

import aiohttp

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Deployment
from sluicegate.providers.base import interrupted, timed_out, unreachable

Classify = Callable[[str, int, bytes, Mapping[str, str]], GatewayError]
"""(deployment, status, body, headers) -> the error the caller should see."""


class UpstreamBody:
    """A started upstream answer (status < 400), its read failures already normalised."""

    __slots__ = ("_deployment", "_response", "ended")

    def __init__(self, response: aiohttp.ClientResponse, deployment: str) -> None:
        self._response = response
        self._deployment = deployment
        self.ended = False
        """True once the upstream itself finished or broke the response, not we."""

    async def read(self) -> bytes:
        try:
            body = await self._response.read()
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except aiohttp.ClientError as exc:
            self.ended = True
            raise interrupted(self._deployment, exc) from None
        self.ended = True
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The bytes as they arrive; judging whether the body is complete is the adapter's."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except aiohttp.ClientError as exc:
            self.ended = True
            raise interrupted(self._deployment, exc) from None
        self.ended = True


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

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.deployment.max_connections, limit_per_host=0, keepalive_timeout=30
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
        self, url: str, body: bytes, budget_s: float, classify: Classify
    ) -> AsyncIterator[UpstreamBody]:
        """POST `body`, giving up after `budget_s` at most; an error status is raised as
        `classify` names it.

        Closing the connection is all a client can do to stop an upstream call, and it
        proves nothing: an attempt abandoned mid-way (cancelled, timed out) keeps its
        caller's permits for `cancel_grace_s` more, the time a server takes to notice."""
        assert self._session is not None, "provider used before start()"
        name = self.deployment.name
        upstream: UpstreamBody | None = None
        ended = False
        try:
            try:
                response = await self._session.post(
                    url, data=body, timeout=self._timeout_within(budget_s)
                )
            except TimeoutError:
                raise timed_out(name) from None
            except aiohttp.ClientError as exc:
                ended = True
                raise unreachable(name, exc) from None
            async with response:
                upstream = UpstreamBody(response, name)
                if response.status >= 400:
                    error = await upstream.read()
                    raise classify(name, response.status, error, response.headers)
                yield upstream
        finally:
            if not (ended or (upstream is not None and upstream.ended)):
                await asyncio.sleep(self.deployment.cancel_grace_s)

    def _timeout_within(self, budget_s: float) -> aiohttp.ClientTimeout:
        t = self._timeout
        if t.total is not None and budget_s >= t.total:
            return t
        return aiohttp.ClientTimeout(total=budget_s, connect=t.connect, sock_read=t.sock_read)


class AdapterResponse:
    """What every adapter's answer shares: the raw body, and the usage once reported."""

    __slots__ = ("_body", "_deployment", "completion_tokens", "used_tokens")

    def __init__(self, body: UpstreamBody, deployment: str) -> None:
        self._body = body
        self._deployment = deployment
        self.used_tokens: int | None = None
        self.completion_tokens: int | None = None

    @property
    def ended(self) -> bool:
        """True once the upstream itself finished or broke the response, not we."""
        return self._body.ended


class HttpProvider:
    """What every HTTP adapter shares: its deployment and a started/closed transport."""

    def __init__(self, deployment: Deployment, headers: dict[str, str]) -> None:
        self.deployment = deployment
        self._transport = Transport(deployment, headers)

    async def start(self) -> None:
        await self._transport.start()

    async def close(self) -> None:
        await self._transport.close()
