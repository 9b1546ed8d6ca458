"""OpenAI-compatible upstreams: vLLM, TGI's OpenAI API and any server speaking that API."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson

from sluicegate.core.types import Deployment, Endpoint
from sluicegate.providers.base import classify_status, interrupted, timed_out, unreachable

_DONE = b"data: [DONE]"
_USAGE = re.compile(rb'"usage":\s*\{[^}]*"total_tokens":\s*(\d+)')
_USAGE_EVENT = re.compile(rb'data: \{[^\n]*"choices":\s*\[\][^\n]*"usage":\s*\{[^\n]*\n\n')


def _total_tokens(data: bytes) -> int | None:
    """The last usage object's total in `data`, if any."""
    matches = _USAGE.findall(data)
    return int(matches[-1]) if matches else None


class OpenAIResponse:
    """Relays the body untouched, except a usage event the gateway asked for itself.

    Token quotas need the real usage of every streamed answer, so the adapter asks for
    `include_usage` when the caller did not, and then removes that one event, whole,
    before it reaches a caller who never asked for it.
    """

    __slots__ = ("_deployment", "_hide_usage", "_response", "ended", "used_tokens")

    def __init__(self, response: aiohttp.ClientResponse, deployment: str, hide_usage: bool) -> None:
        self._response = response
        self._deployment = deployment
        self._hide_usage = hide_usage
        self.used_tokens: int | None = None
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
        self.used_tokens = _total_tokens(body[body.rfind(b'"usage"') :])
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        """SSE bytes as they arrive; a stream that ends without `[DONE]` was cut short."""
        previous = last = b""
        try:
            async for chunk in self._events() if self._hide_usage else self._raw():
                yield chunk
                previous, last = last, chunk
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except aiohttp.ClientError as exc:
            self.ended = True
            raise interrupted(self._deployment, exc) from None
        self.ended = True
        if not (previous + last).rstrip().endswith(_DONE):
            raise interrupted(self._deployment)
        if not self._hide_usage:
            self.used_tokens = _total_tokens(previous + last)

    def _raw(self) -> AsyncIterator[bytes]:
        return self._response.content.iter_any()

    async def _events(self) -> AsyncIterator[bytes]:
        """Whole SSE events only, so the usage event can be recognised and dropped."""
        pending = b""
        async for data in self._response.content.iter_any():
            data = pending + data if pending else data
            cut = data.rfind(b"\n\n") + 2
            if cut < 2:
                pending = data
                continue
            chunk, pending = data[:cut], data[cut:]
            if b'"usage"' in chunk:
                chunk = self._take_usage(chunk)
            if chunk:
                yield chunk
        if pending:
            yield pending

    def _take_usage(self, chunk: bytes) -> bytes:
        event = _USAGE_EVENT.search(chunk)
        if event is None:
            return chunk
        self.used_tokens = _total_tokens(event.group(0))
        return chunk[: event.start()] + chunk[event.end() :]


class OpenAIProvider:
    """One pooled aiohttp session per deployment, so each has its own connection limit."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self._session: aiohttp.ClientSession | None = None
        self._urls = {e: deployment.base_url + e.path.removeprefix("/v1") for e in Endpoint}
        self._headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if deployment.api_key is not None:
            self._headers["authorization"] = f"Bearer {deployment.api_key}"
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
    async def open(
        self, endpoint: Endpoint, payload: dict[str, Any], budget_s: float
    ) -> AsyncIterator[OpenAIResponse]:
        """Closing the connection is all a client can do to stop an upstream call, and it
        proves nothing: an attempt abandoned mid-way (cancelled, timed out) keeps its
        caller's permits for `cancel_grace_s` more, the time a server takes to notice."""
        assert self._session is not None, "provider used before start()"
        name = self.deployment.name
        payload["model"] = self.deployment.upstream_model
        hide_usage = payload.get("stream") is True and _ask_for_usage(payload)
        upstream: OpenAIResponse | None = None
        ended = False
        try:
            try:
                response = await self._session.post(
                    self._urls[endpoint],
                    data=orjson.dumps(payload),
                    timeout=self._timeout_within(budget_s),
                )
            except TimeoutError:
                raise timed_out(name) from None
            except aiohttp.ClientError as exc:
                ended = True
                raise unreachable(name, exc) from None
            async with response:
                upstream = OpenAIResponse(response, name, hide_usage)
                if response.status >= 400:
                    body = await upstream.read()
                    raise classify_status(name, response.status, body, response.headers)
                yield upstream
        finally:
            if not (ended or (upstream is not None and upstream.ended)):
                await asyncio.sleep(self.deployment.cancel_grace_s)

    def _timeout_within(self, budget_s: float) -> aiohttp.ClientTimeout:
        t = self._timeout
        if t.total is not None and budget_s >= t.total:
            return t
        return aiohttp.ClientTimeout(total=budget_s, connect=t.connect, sock_read=t.sock_read)


def _ask_for_usage(payload: dict[str, Any]) -> bool:
    """Ask the upstream for usage; True when the caller had not asked for it itself."""
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    payload["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return True
