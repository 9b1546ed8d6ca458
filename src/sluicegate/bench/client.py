"""One attempt of one chat completion, timed the way a caller experiences it.

TTFT is taken at the first SSE event carrying output text (a role-only opening event is
not a token), so a backend that answers headers at once but generates late is not
flattered. Tokens come from the usage the server reports, else from the events counted.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import orjson

from sluicegate.bench.loadgen import Request, SseSplitter, chat_body
from sluicegate.bench.records import OK, Attempt
from sluicegate.bench.retry import retry_hint_s

LANE_HEADER = "x-sluicegate-lane"
TIMEOUT_HEADER = "x-sluicegate-timeout"
RETRY_HEADER = "x-stainless-retry-count"
"""Sent as the `openai` SDKs send it: the number of earlier attempts of this request."""
CHARS_PER_TOKEN = 4
"""The gateway and the simulator both estimate ceil(characters / 4) tokens of a prompt."""
_DONE = b"[DONE]"
Since = Callable[[], float]


def prepare(
    base_url: str,
    model: str,
    key: str,
    lane: str,
    *,
    prompt_tokens: int,
    output_tokens: int,
    stream: bool,
    timeout_s: float,
) -> Request:
    """Prepared once: a request's retries send the same bytes. Its prompt opens with a
    text of its own, as real prompts differ: a backend's prefix cache serves only its
    retries and the continuation of its answer, never another request. Random, not
    seeded: a capacity search's probes replay one seed on one simulator."""
    chars = prompt_tokens * CHARS_PER_TOKEN
    body = chat_body(
        model,
        prompt_chars=chars,
        max_tokens=output_tokens,
        stream=stream,
        opening=f"{uuid.uuid4().hex} ",
    )
    headers = {
        "content-type": "application/json",
        "authorization": f"Bearer {key}",
        LANE_HEADER: lane,
        TIMEOUT_HEADER: f"{timeout_s:g}",
        RETRY_HEADER: "0",
    }
    return Request(f"{base_url}/chat/completions", body, headers, stream)


class _Exchange:
    """What one attempt has seen so far, so a failure part-way still records it."""

    def __init__(self, since: Since) -> None:
        self.since = since
        self.start_s = since()
        self.status = 0
        self.headers: Mapping[str, str] = {}
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.longest_gap_s: float | None = None
        self.chunks = 0
        self.usage: dict[str, Any] = {}
        self.prefill_s: float | None = None

    def token(self) -> None:
        now = self.since()
        if self.last_s is not None:
            self.longest_gap_s = max(self.longest_gap_s or 0.0, now - self.last_s)
        self.last_s = now
        if self.first_s is None:
            self.first_s = now
        self.chunks += 1

    def finish(self, error: str) -> Attempt:
        should_retry = self.headers.get("x-should-retry")
        return Attempt(
            start_s=self.start_s,
            end_s=self.since(),
            status=self.status,
            error=error,
            retry_after_s=retry_hint_s(self.headers),
            should_retry=None if should_retry is None else should_retry == "true",
            first_token_s=self.first_s,
            last_token_s=self.last_s,
            prompt_tokens=int(self.usage.get("prompt_tokens") or 0),
            output_tokens=int(self.usage.get("completion_tokens") or self.chunks),
            backend_prefill_s=self.prefill_s,
            gateway_queue_s=queue_from_server_timing(self.headers.get("server-timing")),
            longest_gap_s=self.longest_gap_s,
        )


async def send(
    session: aiohttp.ClientSession,
    request: Request,
    timeout_s: float,
    since: Since,
    retries: int = 0,
) -> Attempt:
    """Never raises for what a server or network can do; cancellation passes through."""
    exchange = _Exchange(since)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = request.headers
    if retries:
        headers = {**headers, RETRY_HEADER: str(retries)}
    try:
        async with session.post(
            request.url, data=request.body, headers=headers, timeout=timeout
        ) as response:
            exchange.status = response.status
            exchange.headers = response.headers
            if response.status != 200:
                return exchange.finish(_error_code(await response.read(), response.status))
            if request.stream:
                return exchange.finish(await _read_stream(response, exchange))
            return exchange.finish(_read_body(await response.read(), exchange))
    except TimeoutError:
        return exchange.finish("timeout")
    except aiohttp.ClientError:
        return exchange.finish("stream_cut" if exchange.status else "connection_error")
    except orjson.JSONDecodeError:
        return exchange.finish("bad_body")


async def _read_stream(response: aiohttp.ClientResponse, exchange: _Exchange) -> str:
    events = SseSplitter()
    async for data in response.content.iter_any():
        for event in events.feed(data):
            if not event.startswith(b"data:"):
                continue
            payload = event[5:].strip()
            if payload == _DONE:
                return OK
            error = _stream_event(_object(payload), exchange)
            if error is not None:
                return error
    return "stream_cut"


def _stream_event(event: dict[str, Any], exchange: _Exchange) -> str | None:
    """An error event ends the attempt; a chunk with text is a token; usage is kept."""
    if "error" in event:
        return _code(event["error"]) or "stream_error"
    if event.get("usage"):
        exchange.usage = event["usage"]
        prefill = (event.get("sim_timing") or {}).get("prefill_s")
        exchange.prefill_s = float(prefill) if isinstance(prefill, int | float) else None
    for choice in event.get("choices") or ():
        if (choice.get("delta") or {}).get("content") or choice.get("text"):
            exchange.token()
    return None


def _read_body(body: bytes, exchange: _Exchange) -> str:
    exchange.usage = _object(body).get("usage") or {}
    exchange.first_s = exchange.last_s = exchange.since()
    return OK


def queue_from_server_timing(timing: str | None) -> float | None:
    """The gateway's own wait before dispatch from a Server-Timing header, in seconds:
    its `admission` and `queue` stages together; None without a `queue` stage."""
    stages: dict[str, float] = {}
    for metric in (timing or "").split(","):
        name, _, params = metric.strip().partition(";")
        if name in ("admission", "queue") and params.startswith("dur="):
            try:
                stages[name] = float(params[4:]) / 1000
            except ValueError:
                return None
    if "queue" not in stages:
        return None
    return stages["queue"] + stages.get("admission", 0.0)


def _error_code(body: bytes, status: int) -> str:
    """The OpenAI-shaped error's `code`, else `http_STATUS`."""
    try:
        code = _code(_object(body).get("error"))
    except orjson.JSONDecodeError:
        code = None
    return code or f"http_{status}"


def _object(data: bytes) -> dict[str, Any]:
    value = orjson.loads(data)
    return value if isinstance(value, dict) else {}


def _code(error: object) -> str | None:
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and code else None
