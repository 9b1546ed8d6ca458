"""OpenAI-compatible upstreams: vLLM, TGI's OpenAI API and any server speaking that API."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson

from sluicegate.core.types import Deployment, Endpoint
from sluicegate.providers.base import classify_status, interrupted, malformed
from sluicegate.providers.sse import EventSplitter, EventTooLarge, event_start, events
from sluicegate.providers.transport import AdapterResponse, HttpProvider, UpstreamBody

_DONE = b"data: [DONE]"
_USAGE = re.compile(rb'"usage":\s*\{[^}]*')
_TOTAL = re.compile(rb'"total_tokens":\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens":\s*(\d+)')
_CACHED = re.compile(rb'"cached_tokens":\s*(\d+)')
_TAIL_BYTES = 4096
"""Enough of a stream's end to hold its usage event and `[DONE]` however it was cut."""
_NO_CHOICES = re.compile(rb'"choices":\s*\[\]')


def _usage(data: bytes) -> tuple[int | None, int | None, int | None]:
    """The total, completion and cached prompt tokens of the last usage object in
    `data`, if any."""
    objects = _USAGE.findall(data)
    if not objects:
        return None, None, None
    found = (pattern.search(objects[-1]) for pattern in (_TOTAL, _COMPLETION, _CACHED))
    total, completion, cached = (None if m is None else int(m.group(1)) for m in found)
    return total, completion, cached


class OpenAIResponse(AdapterResponse):
    """Relays the body untouched, except a usage event the gateway asked for itself.

    Token quotas need the real usage of every streamed answer, so the adapter asks for
    `include_usage` when the caller did not, and then removes that one event, whole,
    before it reaches a caller who never asked for it.
    """

    __slots__ = ("_hide_usage",)

    def __init__(self, body: UpstreamBody, deployment: str, hide_usage: bool) -> None:
        super().__init__(body, deployment)
        self._hide_usage = hide_usage

    async def read(self) -> bytes:
        """The body, relayed as sent once it proved to be one JSON object: a body cut
        short, or an HTML page behind a JSON content type, must not reach a caller or a
        stored job as an answer."""
        body = await self._body.read()
        try:
            whole = isinstance(orjson.loads(body), dict)
        except orjson.JSONDecodeError:
            whole = False
        if not whole:
            raise malformed(self._deployment, "a body that is not a JSON object")
        self._read_usage(body[body.rfind(b'"usage"') :])
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        """SSE bytes as they arrive; a stream that ends without `[DONE]` was cut short."""
        tail = b""
        async for chunk in self._events() if self._hide_usage else self._body.chunks():
            yield chunk
            tail = tail[-_TAIL_BYTES:] + chunk if len(chunk) < _TAIL_BYTES else chunk
        if not tail.rstrip().endswith(_DONE):
            raise interrupted(self._deployment)
        if not self._hide_usage:
            self._read_usage(tail)

    async def _events(self) -> AsyncIterator[bytes]:
        """Whole SSE events only, so the usage event can be recognised and dropped."""
        splitter = EventSplitter()
        try:
            async for data in self._body.chunks():
                block = splitter.feed(data)
                usage = block.find(b'"usage"')
                if usage >= 0:
                    block = self._take_usage(block, event_start(block, usage))
                if block:
                    yield block
        except EventTooLarge as exc:
            raise interrupted(self._deployment, exc) from None
        rest = splitter.rest()
        if rest:
            yield rest

    def _take_usage(self, block: bytes, start: int) -> bytes:
        """`block` without the usage event; the events before `start` are not looked at
        (a whole streamed answer often arrives in one block, its usage event near the end)."""
        kept = [block[:start]]
        for raw, data in events(block, start):
            if data is not None and b'"usage"' in data and _NO_CHOICES.search(data):
                self._read_usage(data)
            else:
                kept.append(raw)
        return b"".join(kept)

    def _read_usage(self, data: bytes) -> None:
        self.used_tokens, self.completion_tokens, self.cached_tokens = _usage(data)


class OpenAIProvider(HttpProvider):
    """The request passes through; only the model name and the usage request change."""

    def __init__(self, deployment: Deployment) -> None:
        headers: dict[str, str] = {}
        if deployment.api_key is not None:
            headers["authorization"] = f"Bearer {deployment.api_key}"
        super().__init__(deployment, headers)
        self._urls = {e: deployment.base_url + e.path.removeprefix("/v1") for e in Endpoint}

    @asynccontextmanager
    async def open(
        self, endpoint: Endpoint, payload: dict[str, Any], budget_s: float
    ) -> AsyncIterator[OpenAIResponse]:
        """As `Transport.post`: the context ends only once the upstream call has ended."""
        # A copy: after a failure the same payload goes to the next link of a fallback chain.
        request = {**payload, "model": self.deployment.upstream_model}
        hide_usage = request.get("stream") is True and _ask_for_usage(request)
        url, body = self._urls[endpoint], orjson.dumps(request)
        streamed = request.get("stream") is True
        async with self._transport.post(url, body, budget_s, classify_status, streamed) as upstream:
            yield OpenAIResponse(upstream, self.deployment.name, hide_usage)


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
