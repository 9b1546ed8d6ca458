"""Anthropic Messages upstreams behind the gateway's OpenAI chat-completions face.

Callers always speak OpenAI; this adapter rewrites the request, the answer, the stream
and the errors both ways, so a fallback between provider types is invisible to them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson

from sluicegate.core.types import Deployment, Endpoint
from sluicegate.providers.anthropic_errors import classify, unsupported
from sluicegate.providers.anthropic_request import include_usage, messages_request
from sluicegate.providers.anthropic_response import cached_tokens, chat_completion
from sluicegate.providers.anthropic_stream import StreamBroken, StreamTranslator
from sluicegate.providers.base import interrupted, malformed
from sluicegate.providers.transport import AdapterResponse, HttpProvider, UpstreamBody

API_VERSION = "2023-06-01"


class AnthropicResponse(AdapterResponse):
    """The upstream answer, translated as it is read; Anthropic always reports usage, so a
    complete answer always has `used_tokens`."""

    __slots__ = ("_include_usage",)

    def __init__(self, body: UpstreamBody, deployment: str, include_usage: bool) -> None:
        super().__init__(body, deployment)
        self._include_usage = include_usage

    async def read(self) -> bytes:
        body = await self._body.read()
        try:
            message = orjson.loads(body)
            reply = chat_completion(message, int(time.time()))
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
            raise malformed(self._deployment) from None
        self.used_tokens = reply["usage"]["total_tokens"]
        self.completion_tokens = reply["usage"]["completion_tokens"]
        self.cached_tokens = cached_tokens(message["usage"])
        return orjson.dumps(reply)

    async def chunks(self) -> AsyncIterator[bytes]:
        """OpenAI SSE events; an upstream error event or a missing `message_stop` raises."""
        translator = StreamTranslator(int(time.time()), self._include_usage)
        try:
            async for data in self._body.chunks():
                events = translator.feed(data)
                if events:
                    yield events
            translator.finish()
        except StreamBroken as exc:
            if exc.upstream_ended:
                self._body.ended = True
            raise interrupted(self._deployment, exc) from exc
        self.used_tokens = translator.used_tokens
        self.completion_tokens = translator.completion_tokens
        self.cached_tokens = translator.cached_tokens


class AnthropicProvider(HttpProvider):
    """Serves the chat endpoint only: the Messages API has no completions or embeddings."""

    def __init__(self, deployment: Deployment) -> None:
        headers = {"anthropic-version": API_VERSION}
        if deployment.api_key is not None:
            headers["x-api-key"] = deployment.api_key
        super().__init__(deployment, headers)
        self._url = deployment.base_url + "/messages"

    @asynccontextmanager
    async def open(
        self, endpoint: Endpoint, payload: dict[str, Any], budget_s: float
    ) -> AsyncIterator[AnthropicResponse]:
        """As `Transport.post`: the context ends only once the upstream call has ended."""
        if endpoint is not Endpoint.CHAT:
            raise unsupported(f"the {endpoint.value} endpoint")
        body = orjson.dumps(messages_request(payload, self.deployment.upstream_model))
        name = self.deployment.name
        streamed = payload.get("stream") is True
        async with self._transport.post(self._url, body, budget_s, classify, streamed) as upstream:
            yield AnthropicResponse(upstream, name, include_usage(payload))
