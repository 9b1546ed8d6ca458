"""Gateway metrics. Labels come from config (route, model, deployment) or closed sets.

Labelled children are bound once per label set and cached, so the hot path does a
dict lookup rather than prometheus_client's label resolution on every request. The
series every request updates are `PlainFamily` counters, gauges and histograms: plain
numbers read at scrape time, exposed exactly as prometheus_client's own types expose
them.
"""

from __future__ import annotations

import asyncio
import math
import operator
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sluicegate.capacity.gates import BackendGate
from sluicegate.capacity.pools import Pool
from sluicegate.observability.collectors import (
    CapacityCollector,
    OverloadCollector,
    StoreCollector,
)
from sluicegate.observability.siblings import Siblings
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.overload import OverloadMonitor
from sluicegate.stores.failover import FailoverStore

LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

TPOT_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
"""Per output token: a healthy engine decodes in 10-50 ms, a crowded one in hundreds."""

STAGES = ("admission", "guardrail", "queue", "upstream", "answer_check", "transfer")
"""The stages of the time to first byte (`core.slo.Timeline`)."""

REFUSAL_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 2.5, 10.0)
"""Fine below 5 ms, where a refusal answered at once should be."""

UNKNOWN_MODEL = "-"


def status_class(status: int) -> str:
    """A closed label set: 2xx..5xx, and `cancelled` for callers that went away."""
    return "cancelled" if status == 499 else f"{status // 100}xx"


def _created_series() -> bool:
    """prometheus_client's own switch for `_created` samples (its environment variable
    and `disable_created_metrics()`), read where its own types read it."""
    return prometheus_metrics._use_created


class CounterChild:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def add_to(self, metric: Metric, name: str, labels: dict[str, str]) -> None:
        metric.add_sample(f"{name}_total", labels, self.value)
        if _created_series():
            metric.add_sample(f"{name}_created", labels, self.created)


class GaugeChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1

    def add_to(self, metric: Metric, name: str, labels: dict[str, str]) -> None:
        metric.add_sample(name, labels, self.value)


class HistogramChild:
    """Counts per bucket (not cumulative) and the sum; `bounds` ends with +Inf."""

    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value

    def add_to(self, metric: Metric, name: str, labels: dict[str, str]) -> None:
        total = 0.0
        for bound, count in zip(self._bounds, self.counts, strict=True):
            total += count
            metric.add_sample(f"{name}_bucket", {**labels, "le": floatToGoString(bound)}, total)
        metric.add_sample(f"{name}_count", labels, total)
        metric.add_sample(f"{name}_sum", labels, self.sum)
        if _created_series():
            metric.add_sample(f"{name}_created", labels, self.created)


Child = TypeVar("Child", CounterChild, GaugeChild, HistogramChild)


class PlainFamily(Collector, Generic[Child]):
    """A labelled family whose children are plain numbers. prometheus_client's own
    types take a lock for every increment (a histogram observation takes two and walks
    its buckets in Python): about 40 k instructions for a request's six updates. Here
    every update comes from the event loop's thread, and a scrape reads them there."""

    def __init__(
        self,
        name: str,
        documentation: str,
        kind: str,
        labelnames: tuple[str, ...],
        new: Callable[[], Child],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._kind = kind
        self._labelnames = labelnames
        self._new = new
        self._children: dict[tuple[str, ...], Child] = {}
        if not labelnames:
            self.labels()
        registry.register(self)

    def labels(self, *values: str) -> Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._new()
        return child

    def describe(self) -> Iterator[Metric]:
        yield Metric(self._name, self._documentation, self._kind)

    def collect(self) -> Iterator[Metric]:
        metric = Metric(self._name, self._documentation, self._kind)
        for values, child in self._children.items():
            child.add_to(metric, self._name, dict(zip(self._labelnames, values, strict=True)))
        yield metric


def buckets(upper: tuple[float, ...]) -> Callable[[], HistogramChild]:
    """New children of a histogram with these upper bounds (+Inf is added)."""
    bounds = (*(float(b) for b in upper), float("inf"))
    return lambda: HistogramChild(bounds)


@dataclass(frozen=True, slots=True)
class LaneMetrics:
    """The children bound to one (route, model, lane): how long its successful requests
    took in all and in each stage, their time per output token, and the tokens its
    accepted requests used."""

    latency: HistogramChild
    ttft: HistogramChild
    stages: dict[str, HistogramChild]
    stream: HistogramChild
    tpot: HistogramChild
    prompt_tokens: CounterChild
    completion_tokens: CounterChild


class GatewayMetrics:
    """`tenant_labels` False leaves the families labelled by tenant off the page (tenant
    names may be customers' names); `cache_s` is how long a merged page is reused."""

    def __init__(self, *, tenant_labels: bool = True, cache_s: float = 1.0) -> None:
        self._tenant_labels = tenant_labels
        self._cache_s = cache_s
        self._page: tuple[float, bytes] | None = None
        """The last merged page and when it was built."""
        self._building: asyncio.Future[bytes] | None = None
        self.pages_built = 0
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        r = self.registry
        latency = buckets(LATENCY_BUCKETS_S)
        self._requests = PlainFamily(
            "sluicegate_requests",
            "Requests answered, by outcome class.",
            "counter",
            ("route", "model", "status_class"),
            CounterChild,
            r,
        )
        self._in_flight = PlainFamily(
            "sluicegate_requests_in_flight",
            "Requests being handled now.",
            "gauge",
            ("route",),
            GaugeChild,
            r,
        )
        self._latency = PlainFamily(
            "sluicegate_request_duration_seconds",
            "Arrival to last byte sent, successful requests.",
            "histogram",
            ("route", "model", "lane"),
            latency,
            r,
        )
        self._ttft = PlainFamily(
            "sluicegate_time_to_first_token_seconds",
            "Arrival to the first content byte handed to the caller, successful requests "
            "(a non-streamed answer's first byte comes with its whole body).",
            "histogram",
            ("route", "model", "lane"),
            latency,
            r,
        )
        self._stages = PlainFamily(
            "sluicegate_stage_seconds",
            "Successful requests' time per stage: admission (gates, body), guardrail (pre-call "
            "checks), queue (waiting "
            "for a turn, earlier attempts included), upstream (the deployment's queue and "
            "prefill, or its whole body), transfer (to the caller's first byte) and stream "
            "(first to last byte).",
            "histogram",
            ("route", "model", "lane", "stage"),
            latency,
            r,
        )
        self._queue_wait = PlainFamily(
            "sluicegate_queue_wait_seconds",
            "Time from joining a lane's queue to dispatch (0 for immediate dispatch).",
            "histogram",
            ("model", "lane"),
            buckets((0.0, *LATENCY_BUCKETS_S)),
            r,
        )
        self._protected_wait = PlainFamily(
            "sluicegate_protected_wait_seconds",
            "The queue wait of top-lane requests that arrived within their tenant's share "
            "and were dispatched (0 for immediate dispatch).",
            "histogram",
            ("model",),
            buckets((0.0, *LATENCY_BUCKETS_S)),
            r,
        )
        self._prediction_error = PlainFamily(
            "sluicegate_queue_wait_prediction_error_seconds",
            "How far each queued request's real wait was from the wait predicted when it "
            "was admitted (|real - predicted|), before later predictions were corrected.",
            "histogram",
            ("model", "lane"),
            latency,
            r,
        )
        self._attempts = PlainFamily(
            "sluicegate_attempts_per_request",
            "Upstream attempts a request needed before its answer started.",
            "histogram",
            (),
            buckets((1, 2, 3, 4, 5, 10)),
            r,
        )
        self._retries = Counter(
            "sluicegate_retries",
            "Attempts that failed and were retried, by deployment and code.",
            ["deployment", "code"],
            registry=r,
        )
        self._hedges = Counter(
            "sluicegate_hedges", "Hedged second attempts, sent and won.", ["outcome"], registry=r
        )
        self._throttles = Counter(
            "sluicegate_pool_throttles",
            "Provider throttling answers that put a pool in cooldown.",
            ["pool"],
            registry=r,
        )
        self._ladder = Counter(
            "sluicegate_ladder_actions",
            "Fallback ladder rewrites applied, by action.",
            ["action"],
            registry=r,
        )
        self._refusals = PlainFamily(
            "sluicegate_refusals",
            "Requests refused by the gateway's own limits, by reason.",
            "counter",
            ("route", "reason", "status"),
            CounterChild,
            r,
        )
        self._refusal_time = PlainFamily(
            "sluicegate_refusal_seconds",
            "From a refused request's arrival to its refusal, by reason (expired, "
            "deadline_exceeded and shed requests waited in a queue first).",
            "histogram",
            ("route", "reason"),
            buckets(REFUSAL_BUCKETS_S),
            r,
        )
        self._upstream_errors = Counter(
            "sluicegate_upstream_errors",
            "Failed upstream attempts, by normalised error code.",
            ["deployment", "code"],
            registry=r,
        )
        self._scrape_failures = Counter(
            "sluicegate_backend_scrape_failures",
            "Backend metric scrapes that gave no sample, by deployment and reason "
            "(unreachable, timeout, status, too_large, malformed).",
            ["deployment", "reason"],
            registry=r,
        )
        self._job_backlog = Gauge(
            "sluicegate_job_backlog",
            "Queued jobs per lane, all replicas together (refreshed by the expiry sweep).",
            ["lane"],
            registry=r,
        )
        self._job_backlog_age = Gauge(
            "sluicegate_job_backlog_oldest_age_seconds",
            "How long the oldest queued job of the lane has waited.",
            ["lane"],
            registry=r,
        )
        self._jobs = Gauge(
            "sluicegate_jobs",
            "Jobs in the store by state, all replicas together (refreshed by the expiry sweep).",
            ["state"],
            registry=r,
        )
        self._job_attempts = Histogram(
            "sluicegate_job_attempts",
            "Claims a job took until this process gave it a final state.",
            buckets=(1, 2, 3, 5, 10, 20),
            registry=r,
        )
        self._access_dropped = Counter(
            "sluicegate_access_log_dropped",
            "Access-log lines dropped because the writer was behind (a disk that stalls).",
            registry=r,
        )
        self._job_handbacks = Counter(
            "sluicegate_job_handbacks",
            "Claimed jobs handed straight back to the store: the hand-off queue was full.",
            registry=r,
        )
        self._judged = PlainFamily(
            "sluicegate_request_outcomes",
            "Finished requests judged against their lane's SLOs: `kind` is met, missed, "
            "failed (accepted: these three), refused, invalid or abandoned; `outcome` names "
            "the SLO missed first, or the refusal or failure code. Every arrival counts "
            "once: the sum is the offered load (lane and model `-` before they are known).",
            "counter",
            ("route", "model", "lane", "outcome", "kind"),
            CounterChild,
            r,
        )
        self._tenant_judged = PlainFamily(
            "sluicegate_tenant_request_outcomes",
            "Finished requests of each configured tenant by lane and kind (as in "
            "sluicegate_request_outcomes).",
            "counter",
            ("tenant", "lane", "kind"),
            CounterChild,
            r,
        )
        self._tpot = PlainFamily(
            "sluicegate_time_per_output_token_seconds",
            "(last token - first token) / (completion tokens - 1) of successful streams of "
            "two tokens or more, as their deployment reported the tokens.",
            "histogram",
            ("route", "model", "lane"),
            buckets(TPOT_BUCKETS_S),
            r,
        )
        self._tokens = PlainFamily(
            "sluicegate_request_tokens",
            "Tokens the deployments reported for accepted requests, by kind (prompt, "
            "completion): over the met count, the cost of a successful request.",
            "counter",
            ("route", "model", "lane", "kind"),
            CounterChild,
            r,
        )
        self._spend = PlainFamily(
            "sluicegate_spend_dollars",
            "What the deployments billed, at their configured prices, per tenant and model: "
            "every attempt, retries, hedges and jobs included.",
            "counter",
            ("tenant", "model"),
            CounterChild,
            r,
        )
        self._success_cost = PlainFamily(
            "sluicegate_successful_request_cost_dollars",
            "What successful requests cost, all their attempts included: over their count "
            "(sluicegate_request_outcomes, kind met or missed), the cost per successful "
            "request.",
            "counter",
            ("model", "lane"),
            CounterChild,
            r,
        )
        self._budget_used = PlainFamily(
            "sluicegate_budget_used_ratio",
            "Each budget's current period: spend and reservations over its amount, as last "
            "seen by this process (`model` * for a budget on all models).",
            "gauge",
            ("tenant", "model", "period"),
            GaugeChild,
            r,
        )
        self._budget_soft = PlainFamily(
            "sluicegate_budget_soft_reached",
            "1 while a budget's current period is past its soft threshold, else 0.",
            "gauge",
            ("tenant", "model", "period"),
            GaugeChild,
            r,
        )
        self._lanes: dict[tuple[str, str, str], LaneMetrics] = {}
        self._verdicts: dict[tuple[str, str, str, str, str], CounterChild] = {}
        self._tenant_verdicts: dict[tuple[str, str, str], CounterChild] = {}
        self._outcomes: dict[tuple[str, str, int], CounterChild] = {}
        self._refusals_of: dict[tuple[str, str, int], tuple[CounterChild, HistogramChild]] = {}
        self._siblings: Siblings | None = None
        self._guardrail_decisions = PlainFamily(
            "sluicegate_guardrail_decisions",
            "Guardrail decisions by outcome: passed, flagged, failed_open (the check could "
            "not answer and let the text through), failed_closed (it could not and refused).",
            "counter",
            ("guardrail", "outcome"),
            CounterChild,
            r,
        )
        self._guardrail_time = PlainFamily(
            "sluicegate_guardrail_duration_seconds",
            "Time per guardrail decision, cache hits and failures included.",
            "histogram",
            ("guardrail",),
            buckets(REFUSAL_BUCKETS_S),
            r,
        )
        self._guardrail_timeouts = PlainFamily(
            "sluicegate_guardrail_timeouts",
            "Checks (a guardrail's checker or its fallback) that ran out of their budget.",
            "counter",
            ("guardrail",),
            CounterChild,
            r,
        )
        self._guardrail_cached = PlainFamily(
            "sluicegate_guardrail_cache_hits",
            "Guardrail decisions answered from the decision cache.",
            "counter",
            ("guardrail",),
            CounterChild,
            r,
        )

    def lane(self, route: str, model: str, lane: str) -> LaneMetrics:
        key = (route, model, lane)
        bound = self._lanes.get(key)
        if bound is None:
            stages = {stage: self._stages.labels(*key, stage) for stage in STAGES}
            bound = self._lanes[key] = LaneMetrics(
                self._latency.labels(*key),
                self._ttft.labels(*key),
                stages,
                self._stages.labels(*key, "stream"),
                self._tpot.labels(*key),
                self._tokens.labels(*key, "prompt"),
                self._tokens.labels(*key, "completion"),
            )
        return bound

    def judged(
        self, route: str, model: str, lane: str, tenant: str | None, outcome: str, kind: str
    ) -> None:
        """One finished request's verdict; `tenant` None when it is not a configured one
        (refused before it was known)."""
        key = (route, model, lane, outcome, kind)
        counter = self._verdicts.get(key)
        if counter is None:
            counter = self._verdicts[key] = self._judged.labels(*key)
        counter.inc()
        if tenant is not None:
            by_tenant = (tenant, lane, kind)
            counter = self._tenant_verdicts.get(by_tenant)
            if counter is None:
                counter = self._tenant_verdicts[by_tenant] = self._tenant_judged.labels(*by_tenant)
            counter.inc()

    def guardrail_decided(self, guardrail: str, outcome: str, took_s: float) -> None:
        self._guardrail_decisions.labels(guardrail, outcome).inc()
        self._guardrail_time.labels(guardrail).observe(took_s)

    def guardrail_timed_out(self, guardrail: str) -> None:
        self._guardrail_timeouts.labels(guardrail).inc()

    def guardrail_cached(self, guardrail: str) -> None:
        self._guardrail_cached.labels(guardrail).inc()

    def spent(self, tenant: str, model: str, dollars: float) -> None:
        self._spend.labels(tenant, model).inc(dollars)

    def success_cost(self, model: str, lane: str, dollars: float) -> None:
        self._success_cost.labels(model, lane).inc(dollars)

    def budget_used(
        self, tenant: str, model: str | None, period: str, ratio: float, soft: float | None
    ) -> None:
        labels = (tenant, model or "*", period)
        self._budget_used.labels(*labels).value = ratio
        self._budget_soft.labels(*labels).value = float(soft is not None and ratio >= soft)

    def in_flight(self, route: str) -> GaugeChild:
        return self._in_flight.labels(route)

    def answered(self, route: str, model: str, status: int) -> None:
        key = (route, model, status)
        counter = self._outcomes.get(key)
        if counter is None:
            counter = self._outcomes[key] = self._requests.labels(
                route, model, status_class(status)
            )
        counter.inc()

    def attempts(self, count: int) -> None:
        self._attempts.labels().observe(count)

    def retried(self, deployment: str, code: str) -> None:
        self._retries.labels(deployment, code).inc()

    def hedge(self, outcome: str) -> None:
        self._hedges.labels(outcome).inc()

    def throttled(self, pool: str) -> None:
        self._throttles.labels(pool).inc()

    def ladder_action(self, action: str) -> None:
        self._ladder.labels(action).inc()

    def watch_overload(self, monitor: OverloadMonitor) -> None:
        self.registry.register(OverloadCollector(monitor))

    def watch_store(self, store: FailoverStore) -> None:
        self.registry.register(StoreCollector(store))

    def refused(self, route: str, reason: str, status: int, took_s: float) -> None:
        key = (route, reason, status)
        children = self._refusals_of.get(key)
        if children is None:
            children = self._refusals_of[key] = (
                self._refusals.labels(route, reason, str(status)),
                self._refusal_time.labels(route, reason),
            )
        counter, took = children
        counter.inc()
        took.observe(took_s)

    def watch(
        self,
        pools: Iterable[Pool],
        dispatchers: Iterable[Dispatcher],
        gates: Mapping[str, BackendGate],
    ) -> None:
        self.registry.register(CapacityCollector(pools, dispatchers, gates))

    def queue_waited(
        self,
        model: str,
        lane: str,
        wait_s: float,
        predicted_s: float | None,
        protected: bool,
    ) -> None:
        self._queue_wait.labels(model, lane).observe(wait_s)
        if protected:
            self._protected_wait.labels(model).observe(wait_s)
        if predicted_s is not None:
            self._prediction_error.labels(model, lane).observe(abs(wait_s - predicted_s))

    def job_backlog(self, lane: str, size: int, oldest_age_s: float) -> None:
        self._job_backlog.labels(lane).set(size)
        self._job_backlog_age.labels(lane).set(oldest_age_s)

    def job_states(self, counts: Mapping[str, int]) -> None:
        for state, count in counts.items():
            self._jobs.labels(state).set(count)

    def job_finished(self, attempts: int) -> None:
        self._job_attempts.observe(attempts)

    def access_line_dropped(self) -> None:
        self._access_dropped.inc()

    def job_handed_back(self) -> None:
        self._job_handbacks.inc()

    def upstream_error(self, deployment: str, code: str) -> None:
        self._upstream_errors.labels(deployment, code).inc()

    def scrape_failed(self, deployment: str) -> Callable[[str], None]:
        """What a deployment's metrics poller calls with the reason of each failed scrape."""
        return lambda reason: self._scrape_failures.labels(deployment, reason).inc()

    def exposition(self) -> bytes:
        return self._shown(self.registry)

    def _shown(self, source: Collector) -> bytes:
        return generate_latest(source if self._tenant_labels else WithoutTenants(source))

    def answered_total(self) -> int:
        """Requests this process answered, for the worker lines of the status document."""
        return int(sum(counter.value for counter in self._outcomes.values()))

    def restarted(self, times: int) -> None:
        """This worker's seat was restarted `times` times: summed over the workers, the
        server's restarts, for as long as its parent runs."""
        restarts = Counter(
            "sluicegate_worker_restarts",
            "Workers the parent of serve --workers restarted after one died or hung.",
            registry=self.registry,
        )
        restarts.inc(times)

    def share(self, siblings: Siblings) -> None:
        """Make `page` report the whole server: this worker's numbers and its siblings'."""
        self._siblings = siblings

    def samples(self) -> bytes:
        """This process's families as plain numbers, for a sibling's `page`: floats, as
        the exposition has them, since an integer sum (a pool's reserved tokens) may pass
        the 64 bits JSON's encoder holds."""
        return orjson.dumps(
            [
                [
                    m.name,
                    m.type,
                    m.documentation,
                    [[s.name, s.labels, float(s.value)] for s in m.samples],
                ]
                for m in self.registry.collect()
            ]
        )

    async def page(self) -> bytes:
        """`/metrics`: this process's exposition, or with workers the whole server's.

        A merged page asks every sibling, so it is built at most once per `cache_s`
        however many scrapers ask: those asking meanwhile are given the last one, and
        those asking while it is built wait for that build."""
        if self._siblings is None:
            return self.exposition()
        page = self._page
        if page is not None and time.monotonic() - page[0] < self._cache_s:
            return page[1]
        building = self._building
        if building is None:
            building = self._building = asyncio.ensure_future(self._merged())
            building.add_done_callback(self._built)
        return await asyncio.shield(building)

    def _built(self, building: asyncio.Future[bytes]) -> None:
        self._building = None
        if not building.cancelled() and building.exception() is None:
            self._page = (time.monotonic(), building.result())

    async def _merged(self) -> bytes:
        siblings = self._siblings
        assert siblings is not None
        self.pages_built += 1
        answers = await siblings.ask("metrics")
        merged = ServerFamilies(siblings.seat.count)
        merged.add(orjson.loads(self.samples()))
        for families in answers.values():
            merged.add(families)
        return self._shown(merged)


class WithoutTenants(Collector):
    """`source` less every family with a tenant label."""

    def __init__(self, source: Collector) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for metric in self._source.collect():
            if not any("tenant" in sample.labels for sample in metric.samples):
                yield metric


TAKES_MAX = frozenset(
    {
        "sluicegate_pool_concurrency_limit",
        "sluicegate_pool_cooldown_seconds",
        "sluicegate_backend_running",
        "sluicegate_backend_waiting",
        "sluicegate_backend_kv_usage",
        "sluicegate_backend_tpot_seconds",
        "sluicegate_backend_prefix_hit_ratio",
        "sluicegate_queue_oldest_age_seconds",
        "sluicegate_queue_age_limit_seconds",
        "sluicegate_queue_wait_correction",
        "sluicegate_queue_wait_tail",
        "sluicegate_reserved_slots",
        "sluicegate_tenant_service",
        "sluicegate_overload_state",
        "sluicegate_overload_pressure",
        "sluicegate_dispatch_gate",
        "sluicegate_circuit",
        "sluicegate_store_degraded",
        "sluicegate_budget_used_ratio",
        "sluicegate_budget_soft_reached",
        "sluicegate_store_live_replicas",
        "sluicegate_job_backlog",
        "sluicegate_job_backlog_oldest_age_seconds",
        "sluicegate_jobs",
        "process_max_fds",
        "python_info",
    }
)
"""Families merged across workers by their largest value: the same setting or fleet-wide
count seen by every worker (limits, the job store's backlog, replicas, each backend's last
scrape), the longest cooldown, the oldest age,
the worst pressure, wait correction and tail, and the one-hot states (1 for every state some
worker is in). The rest are summed: every counter and histogram, and the gauges of what
each worker holds (attempts, queued requests, requests in flight, memory)."""

TAKES_MIN = frozenset({"process_start_time_seconds"})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


class ServerFamilies(Collector):
    """Workers' families merged sample by sample, for one exposition of the whole server."""

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._reporting = 0
        self._families: dict[str, tuple[str, str, dict[SampleKey, float]]] = {}

    def add(self, families: list[list[Any]]) -> None:
        self._reporting += 1
        for name, kind, documentation, samples in families:
            _, _, values = self._families.setdefault(name, (kind, documentation, {}))
            pick = _merge_rule(name)
            for sample, labels, value in samples:
                key = (sample, tuple(sorted(labels.items())))
                number = math.nan if value is None else float(value)
                rule = min if sample.endswith("_created") else pick
                values[key] = number if key not in values else rule(values[key], number)

    def collect(self) -> Iterator[Metric]:
        for name, (kind, documentation, values) in self._families.items():
            metric = Metric(name, documentation, kind)
            for (sample, labels), value in values.items():
                metric.add_sample(sample, dict(labels), value)
            yield metric
        yield GaugeMetricFamily(
            "sluicegate_workers", "Worker processes the server runs.", value=self._workers
        )
        yield GaugeMetricFamily(
            "sluicegate_workers_reporting",
            "Workers whose numbers this page includes (a sibling that did not answer in "
            "time is left out).",
            value=self._reporting,
        )


def _merge_rule(family: str) -> Callable[[float, float], float]:
    if family in TAKES_MAX:
        return max
    if family in TAKES_MIN:
        return min
    return operator.add
