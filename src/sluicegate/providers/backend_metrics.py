"""Read a vLLM-style backend's Prometheus metrics into a `BackendSample` for its gate.

Both generations of vLLM's names are accepted (the KV-cache gauge and the per-token
latency histogram were renamed); values are summed over the backend's label sets.
"""

from __future__ import annotations

import asyncio
import logging
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
TPOT = (
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:request_time_per_output_token_seconds",
)


def parse_sample(text: str) -> BackendSample:
    """Raise ValueError when the text is not a vLLM-like exposition."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    if WAITING not in totals or RUNNING not in totals:
        raise ValueError(f"no {WAITING} / {RUNNING} in the backend's metrics")
    kv = next((totals[name] for name in KV_USAGE if name in totals), None)
    tpot = next((name for name in TPOT if name + "_count" in totals), None)
    return BackendSample(
        waiting=totals[WAITING],
        running=totals[RUNNING],
        kv_usage=kv,
        tpot_sum=None if tpot is None else totals[tpot + "_sum"],
        tpot_count=None if tpot is None else totals[tpot + "_count"],
    )


class MetricsPoller:
    """Scrapes one backend every `interval_s`; a failed scrape leaves the gate to go stale."""

    def __init__(
        self,
        spec: BackendMetrics,
        gate: MetricsGate,
        fleet_in_flight: Callable[[str], Awaitable[int]] | None = None,
    ) -> None:
        self._spec = spec
        self._gate = gate
        self._fleet_in_flight = fleet_in_flight
        """In a fleet: the count of attempts in flight to the backend, read before each
        scrape (a send between the two is then counted by the sample only: conservative)."""
        self.failures = 0

    async def run(self, session: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=max(self._spec.interval_s, 0.5))
        while True:
            try:
                in_flight = await self._fleet_count()
                async with session.get(self._spec.url, timeout=timeout) as response:
                    response.raise_for_status()
                    sample = parse_sample(await response.text())
                self._gate.update(sample, in_flight)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.failures += 1
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
