"""vLLM's Prometheus metrics, read from the engine at scrape time.

The gateway reads these exact names from real vLLM servers, so the simulator exports
them (both the current and the older generation of names) to test that reader. All
values are plain numbers behind one custom collector: a decode step of many sequences
is one `observe` with a count, instead of one locked histogram update per token.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from sluicegate.sim.engine import Engine, Sequence

Generation = Literal["current", "legacy"]

_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
    40.0, 80.0, 160.0,
)  # fmt: skip
_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_BUCKETS = (
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0,
)  # fmt: skip


@dataclass(slots=True)
class _Series:
    counts: list[int]
    total: float = 0.0


@dataclass(slots=True)
class _Histogram:
    """Per-model bucket counts; `observe` takes a count so one call can cover a whole step."""

    bounds: tuple[float, ...]
    series: dict[str, _Series] = field(default_factory=dict)

    def observe(self, model: str, value: float, count: int = 1) -> None:
        series = self.series.get(model)
        if series is None:
            series = self.series[model] = _Series([0] * (len(self.bounds) + 1))
        series.counts[bisect.bisect_left(self.bounds, value)] += count
        series.total += value * count

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=["model_name"])
        for model, series in self.series.items():
            cumulative = list(itertools.accumulate(series.counts))
            buckets = [
                (floatToGoString(b), c) for b, c in zip(self.bounds, cumulative, strict=False)
            ]
            buckets.append(("+Inf", cumulative[-1]))
            family.add_metric([model], buckets, sum_value=series.total)
        return family


class SimMetrics:
    """Engine observer and Prometheus collector in one, on its own registry.

    The engine is shared by every served model, so its gauges carry `gauge_model` (the
    first served model); the histograms and counters carry each request's own model.
    """

    def __init__(self, engine: Engine, gauge_model: str, generation: Generation) -> None:
        self._engine = engine
        self._gauge_model = gauge_model
        self._generation = generation
        self._first_token = _Histogram(_FIRST_TOKEN_BUCKETS)
        self._inter_token = _Histogram(_TOKEN_BUCKETS)
        self._per_output_token = _Histogram(_TOKEN_BUCKETS)
        self._e2e = _Histogram(_REQUEST_BUCKETS)
        self._prompt_tokens: Counter[str] = Counter()
        self._generation_tokens: Counter[str] = Counter()
        self._prefix_queries: Counter[str] = Counter()
        self._prefix_hits: Counter[str] = Counter()
        self._successes: Counter[tuple[str, str]] = Counter()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def first_token(self, seq: Sequence) -> None:
        self._first_token.observe(seq.model, seq.first_token_s - seq.arrival_s)
        self._prompt_tokens[seq.model] += seq.prompt_tokens
        self._generation_tokens[seq.model] += 1
        if seq.text is not None:  # the routes whose prompts the cache sees
            self._prefix_queries[seq.model] += seq.prompt_tokens
            self._prefix_hits[seq.model] += seq.cached_tokens

    def decoded(self, model: str, gap_s: float, count: int) -> None:
        self._inter_token.observe(model, gap_s, count)
        self._generation_tokens[model] += count

    def finished(self, seq: Sequence) -> None:
        self._e2e.observe(seq.model, seq.finish_s - seq.arrival_s)
        if seq.generated > 1:
            decode_s = seq.finish_s - seq.first_token_s
            self._per_output_token.observe(seq.model, decode_s / (seq.generated - 1))
        if seq.max_tokens:
            self._successes[(seq.model, "length")] += 1
        else:  # prefill only (embeddings): no first token counted its prompt
            self._prompt_tokens[seq.model] += seq.prompt_tokens
            self._successes[(seq.model, "stop")] += 1

    def collect(self) -> Iterator[Metric]:
        legacy = self._generation == "legacy"
        load = self._engine.load()
        for name, documentation, value in (
            ("vllm:num_requests_running", "Sequences in the running batch.", load.running),
            ("vllm:num_requests_waiting", "Sequences waiting to be scheduled.", load.waiting),
            (
                "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc",
                "Fraction of KV-cache blocks in use (1 = full).",
                load.kv_cache_usage,
            ),
        ):
            gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
            gauge.add_metric([self._gauge_model], value)
            yield gauge
        yield self._first_token.family(
            "vllm:time_to_first_token_seconds", "Time to the first generated token."
        )
        if legacy:
            yield self._inter_token.family(
                "vllm:time_per_output_token_seconds", "Time between consecutive tokens."
            )
        else:
            yield self._inter_token.family(
                "vllm:inter_token_latency_seconds", "Time between consecutive tokens."
            )
            yield self._per_output_token.family(
                "vllm:request_time_per_output_token_seconds",
                "Decode time of a request divided by its tokens after the first.",
            )
        yield self._e2e.family("vllm:e2e_request_latency_seconds", "Arrival to last token.")
        yield _counter("vllm:prompt_tokens", "Prefilled prompt tokens.", self._prompt_tokens)
        yield _counter("vllm:generation_tokens", "Generated tokens.", self._generation_tokens)
        if self._engine.settings.prefix_caching:
            yield _counter(
                "vllm:prefix_cache_queries", "Prompt tokens looked up.", self._prefix_queries
            )
            yield _counter(
                "vllm:prefix_cache_hits", "Prompt tokens found cached.", self._prefix_hits
            )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Requests that finished.",
            labels=["model_name", "finished_reason"],
        )
        for (model, reason), count in self._successes.items():
            success.add_metric([model, reason], count)
        yield success


def _counter(name: str, documentation: str, totals: Counter[str]) -> CounterMetricFamily:
    counter = CounterMetricFamily(name, documentation, labels=["model_name"])
    for model, total in totals.items():
        counter.add_metric([model], total)
    return counter
