"""An aiohttp load generator: one keep-alive session, three ways to offer load.

Every driver sends the same prepared bytes, so direct and gateway runs differ only in the
path the request takes. Each driver is bounded both in request count and in time.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import aiohttp
import orjson

from sluicegate.bench.stats import percentile

REQUEST_TIMEOUT_S = 30.0
MAX_RATE_PER_WORKER = 20_000.0
"""A ceiling no loopback worker reaches; it turns the time bound into a count bound too."""

_PROMPT_WORDS = "the quick brown fox jumps over the lazy dog while the gateway relays tokens "
_EVENT_END = b"\n\n"
_DONE = b"data: [DONE]"


class BadAnswer(Exception):
    """A response that must not count as a latency sample: non-2xx or a cut-short stream."""


@dataclass(frozen=True, slots=True)
class Request:
    """One chat completion, serialised once and replayed unchanged."""

    url: str
    body: bytes
    headers: Mapping[str, str]
    stream: bool


def chat_request(
    base_url: str, model: str, key: str, *, prompt_chars: int, max_tokens: int, stream: bool
) -> Request:
    """Build the request both paths receive; only `model` differs between them."""
    body = chat_body(model, prompt_chars=prompt_chars, max_tokens=max_tokens, stream=stream)
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    return Request(f"{base_url}/v1/chat/completions", body, headers, stream)


def chat_body(
    model: str, *, prompt_chars: int, max_tokens: int, stream: bool, opening: str = ""
) -> bytes:
    """A chat completion of one filler prompt, after `opening` (which sets it apart from
    the others for a prefix cache); a stream asks for its usage at the end."""
    filler = _PROMPT_WORDS * (prompt_chars // len(_PROMPT_WORDS) + 1)
    prompt = (opening + filler)[:prompt_chars]
    payload: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    return orjson.dumps(payload)


@dataclass(slots=True)
class Tally:
    """Samples from successful requests; failures are counted by reason and kept out."""

    latencies_s: list[float] = field(default_factory=list)
    chunks: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> int:
        return len(self.latencies_s)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def throughput_rps(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else math.nan

    def percentile_ms(self, q: float) -> float:
        """NaN when nothing succeeded."""
        return 1000 * percentile(self.latencies_s, q)


class SseSplitter:
    """Cuts a byte stream into whole SSE events, whatever the read boundaries."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        events = (self._rest + data).split(_EVENT_END)
        self._rest = events.pop()
        return events


class SseCounter:
    """Counts completion chunks (SSE data events before `[DONE]`) across read boundaries."""

    __slots__ = ("_events", "chunks", "done")

    def __init__(self) -> None:
        self._events = SseSplitter()
        self.chunks = 0
        self.done = False

    def feed(self, data: bytes) -> None:
        for event in self._events.feed(data):
            if event == _DONE:
                self.done = True
            elif event.startswith(b"data:"):
                self.chunks += 1


def poisson_arrivals(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Open-loop send offsets in [0, duration_s): exponential gaps, capped in count."""
    cap = math.ceil(rate * duration_s * 3) + 16
    offsets: list[float] = []
    at = rng.expovariate(rate)
    while at < duration_s and len(offsets) < cap:
        offsets.append(at)
        at += rng.expovariate(rate)
    return offsets


def make_session(connections: int) -> aiohttp.ClientSession:
    """The single session for the whole run: pooled keep-alive connections to both ports."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    )


class LoadGen:
    def __init__(self, session: aiohttp.ClientSession, workers: int) -> None:
        self._session = session
        self._workers = workers

    async def one(self, request: Request, tally: Tally) -> None:
        """Send once; record TTFT (streaming) or end-to-end time, or the failure's reason."""
        try:
            latency_s, chunks = await self._exchange(request)
        except (aiohttp.ClientError, TimeoutError, BadAnswer) as exc:
            tally.errors[_reason(exc)] += 1
            return
        tally.latencies_s.append(latency_s)
        tally.chunks += chunks

    async def serial(self, request: Request, tally: Tally, count: int) -> None:
        """One request in flight: latency without any queueing."""
        with _clocked(tally):
            for _ in range(count):
                await self.one(request, tally)

    async def poisson(self, request: Request, tally: Tally, arrivals: list[float]) -> None:
        """Open loop: each arrival is its own task, sent on schedule whatever is in flight."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        with _clocked(tally):
            async with asyncio.TaskGroup() as group:
                for offset in arrivals:
                    await asyncio.sleep(max(0.0, started + offset - loop.time()))
                    group.create_task(self.one(request, tally))

    async def closed(self, request: Request, tally: Tally, duration_s: float) -> None:
        """Closed loop: a fixed number of workers, each sending again as soon as answered."""
        deadline = asyncio.get_running_loop().time() + duration_s
        cap = math.ceil(duration_s * MAX_RATE_PER_WORKER)
        with _clocked(tally):
            async with asyncio.TaskGroup() as group:
                for _ in range(self._workers):
                    group.create_task(self._worker(request, tally, deadline, cap))

    async def _worker(self, request: Request, tally: Tally, deadline: float, cap: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(cap):
            if loop.time() >= deadline:
                return
            await self.one(request, tally)

    async def _exchange(self, request: Request) -> tuple[float, int]:
        started = time.perf_counter()
        async with self._session.post(
            request.url, data=request.body, headers=request.headers
        ) as response:
            if not 200 <= response.status < 300:
                raise BadAnswer(f"http {response.status} {_error_code(await response.read())}")
            if request.stream:
                return await _read_stream(response, started)
            await response.read()
            return time.perf_counter() - started, 0


@contextmanager
def _clocked(tally: Tally) -> Iterator[None]:
    """Add a block's wall time to the tally, which its throughput divides by."""
    started = time.perf_counter()
    try:
        yield
    finally:
        tally.elapsed_s += time.perf_counter() - started


async def _read_stream(response: aiohttp.ClientResponse, started: float) -> tuple[float, int]:
    """TTFT is the time from sending to the first body bytes; the stream must end in [DONE]."""
    first_s = math.nan
    counter = SseCounter()
    async for data in response.content.iter_any():
        if math.isnan(first_s):
            first_s = time.perf_counter() - started
        counter.feed(data)
    if not counter.done:
        raise BadAnswer("stream without [DONE]")
    return first_s, counter.chunks


def _error_code(body: bytes) -> str:
    """An OpenAI-style error body's code, else `-`: failures are tallied by it, so a
    refusal names its cause rather than its status alone."""
    try:
        error = orjson.loads(body)["error"]
        return str(error.get("code") or error.get("type") or "-")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return "-"


def _reason(exc: Exception) -> str:
    """Our own failures say what went wrong; transport failures are named by their type."""
    return str(exc) if isinstance(exc, BadAnswer) else type(exc).__name__
