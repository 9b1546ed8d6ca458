"""Read a vLLM-style backend's Prometheus metrics into a `BackendSample` for its gate.

Both generations of vLLM's names are accepted (the KV-cache gauge and the per-token
latency histogram were renamed); values are summed over the backend's label sets.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.capacity.gates import BackendSample, MetricsGate
from sluicegate.core.limits import StoreUnavailable
from sluicegate.core.types import BackendMetrics

log = logging.getLogger("sluicegate.backend_metrics")

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
"""Prompt tokens the backend looked up in its prefix cache, and found (counters)."""
TPOT = (
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:request_time_per_output_token_seconds",
)


MAX_SCRAPE_BYTES = 4 * 1024 * 1024
"""A vLLM exposition is a few tens of KiB; anything past this is not one."""


class ScrapeFailed(Exception):
    """A scrape that gave no sample; `reason` is the metric's label (a closed set)."""

    def __init__(self, reason: str, detail: object) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def parse_sample(text: str) -> BackendSample:
    """Raise ValueError when the text is not a vLLM-like exposition of finite numbers."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    if WAITING not in totals or RUNNING not in totals:
        raise ValueError(f"no {WAITING} / {RUNNING} in the backend's metrics")
    kv = next((totals[name] for name in KV_USAGE if name in totals), None)
    tpot = next((name for name in TPOT if name + "_count" in totals), None)
    sample = BackendSample(
        waiting=totals[WAITING],
        running=totals[RUNNING],
        kv_usage=kv,
        tpot_sum=None if tpot is None else totals.get(tpot + "_sum"),
        tpot_count=None if tpot is None else totals[tpot + "_count"],
        prefix_queries=totals.get(PREFIX[0]),
        prefix_hits=totals.get(PREFIX[1]),
    )
    read = (
        sample.waiting,
        sample.running,
        sample.kv_usage,
        sample.tpot_sum,
        sample.tpot_count,
        sample.prefix_queries,
        sample.prefix_hits,
    )
    if not all(v is None or (math.isfinite(v) and v >= 0) for v in read):
        raise ValueError("a negative or non-finite value in the backend's metrics")
    return sample


async def scrape(session: aiohttp.ClientSession, url: str, timeout_s: float) -> BackendSample:
    """One scrape, never following a redirect, reading at most `MAX_SCRAPE_BYTES`."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.get(url, timeout=timeout, allow_redirects=False) as response:
            if response.status != 200:
                raise ScrapeFailed("status", response.status)
            body = bytearray()
            async for chunk in response.content.iter_any():
                body += chunk
                if len(body) > MAX_SCRAPE_BYTES:
                    raise ScrapeFailed("too_large", f"over {MAX_SCRAPE_BYTES} bytes")
    except TimeoutError as exc:
        raise ScrapeFailed("timeout", exc) from None
    except aiohttp.ClientError as exc:
        raise ScrapeFailed("unreachable", exc) from None
    try:
        return parse_sample(body.decode("utf-8"))
    except Exception as exc:  # the parser's failures on hostile text are not one type
        raise ScrapeFailed("malformed", exc) from None


class MetricsPoller:
    """Scrapes one backend every `interval_s`; a failed scrape leaves the gate to go stale
    and is counted by `on_failure(reason)`."""

    def __init__(
        self,
        spec: BackendMetrics,
        gate: MetricsGate,
        fleet_in_flight: Callable[[str], Awaitable[int]] | None = None,
        on_failure: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._spec = spec
        self._gate = gate
        self._fleet_in_flight = fleet_in_flight
        """In a fleet: the count of attempts in flight to the backend, read before each
        scrape (a send between the two is then counted by the sample only: conservative)."""
        self._on_failure = on_failure

    async def run(self, session: aiohttp.ClientSession) -> None:
        timeout_s = max(self._spec.interval_s, 0.5)
        while True:
            try:
                in_flight = await self._fleet_count()
                self._gate.update(await scrape(session, self._spec.url, timeout_s), in_flight)
            except ScrapeFailed as exc:
                self._on_failure(exc.reason)
                log.debug("scrape of %s failed: %s", self._spec.url, exc)
            await asyncio.sleep(self._spec.interval_s)

    async def _fleet_count(self) -> int | None:
        key = self._gate.fleet_key
        if self._fleet_in_flight is None or key is None:
            return None
        try:
            return await self._fleet_in_flight(key)
        except StoreUnavailable:
            return None
