"""OpenAI-compatible upstreams: vLLM, TGI's OpenAI API and any server speaking that API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson

from sluicegate.core.types import Deployment, Endpoint
from sluicegate.providers.base import classify_status, interrupted, timed_out, unreachable

_DONE = b"data: [DONE]"


class OpenAIResponse:
    __slots__ = ("_deployment", "_response")

    def __init__(self, response: aiohttp.ClientResponse, deployment: str) -> None:
        self._response = response
        self._deployment = deployment

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except aiohttp.ClientError as exc:
            raise interrupted(self._deployment, exc) from None

    async def chunks(self) -> AsyncIterator[bytes]:
        """SSE bytes as they arrive; a stream that ends without `[DONE]` was cut short."""
        previous = last = b""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
                previous, last = last, chunk
        except TimeoutError:
            raise timed_out(self._deployment) from None
        except aiohttp.ClientError as exc:
            raise interrupted(self._deployment, exc) from None
        if not (previous + last).rstrip().endswith(_DONE):
            raise interrupted(self._deployment)


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
            connector=connector, timeout=self._timeout, auto_decompress=False
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @asynccontextmanager
    async def open(
        self, endpoint: Endpoint, payload: dict[str, Any]
    ) -> AsyncIterator[OpenAIResponse]:
        assert self._session is not None, "provider used before start()"
        name = self.deployment.name
        payload["model"] = self.deployment.upstream_model
        try:
            response = await self._session.post(
                self._urls[endpoint], data=orjson.dumps(payload), headers=self._headers
            )
        except TimeoutError:
            raise timed_out(name) from None
        except aiohttp.ClientError as exc:
            raise unreachable(name, exc) from None
        async with response:
            if response.status >= 400:
                body = await OpenAIResponse(response, name).read()
                raise classify_status(name, response.status, body, response.headers)
            yield OpenAIResponse(response, name)
