"""What the scheduler, the pools, the gates, the overload monitor and the shared store are
doing, read from their views at scrape time: gauges and counters that cost the request
path nothing."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.capacity.breaker import BreakerState
from sluicegate.capacity.gates import BackendGate, GateState, MetricsGate
from sluicegate.capacity.pools import Pool
from sluicegate.core.types import OverloadState
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.overload import OverloadMonitor
from sluicegate.stores.failover import FailoverStore

BACKEND_GAUGES = (
    ("running", "running", "requests running"),
    ("waiting", "waiting", "requests waiting"),
    ("kv_usage", "kv_usage", "share of its KV cache in use"),
    ("tpot_s", "tpot_seconds", "time per output token between its last two scrapes"),
)
"""The fields of a `BackendView` exported, with their metric names and meanings."""


class CapacityCollector(Collector):
    """Reads pools, lane queues and backend gates at scrape time, so the hot path
    updates no metric for them."""

    def __init__(
        self,
        pools: Iterable[Pool],
        dispatchers: Iterable[Dispatcher],
        gates: Mapping[str, BackendGate],
    ) -> None:
        self._pools = list(pools)
        self._dispatchers = list(dispatchers)
        self._gates = dict(gates)

    def collect(self) -> Iterator[Metric]:
        yield from self._pool_families()
        yield from self._queue_families()
        yield from self._gate_families()

    def _pool_families(self) -> Iterator[Metric]:
        pool = ["pool"]
        active = GaugeMetricFamily(
            "sluicegate_pool_active_attempts", "Attempts holding a permit now.", labels=pool
        )
        limit = GaugeMetricFamily(
            "sluicegate_pool_concurrency_limit", "Most attempts at once.", labels=pool
        )
        reserved = CounterMetricFamily(
            "sluicegate_pool_tokens_reserved", "Tokens reserved by attempts.", labels=pool
        )
        used = CounterMetricFamily(
            "sluicegate_pool_tokens_used", "Tokens the provider reported used.", labels=pool
        )
        cooldown = GaugeMetricFamily(
            "sluicegate_pool_cooldown_seconds",
            "How long the cooldown this process last set on the pool (after a provider's "
            "throttling answer) still runs; 0 when none does.",
            labels=pool,
        )
        unsettled = CounterMetricFamily(
            "sluicegate_pool_tokens_unsettled",
            "Reserved tokens kept because no usage was reported (failed or cut attempts).",
            labels=pool,
        )
        for view in (p.view() for p in self._pools):
            active.add_metric([view.name], view.active)
            limit.add_metric([view.name], view.limit)
            reserved.add_metric([view.name], view.tokens_reserved)
            used.add_metric([view.name], view.tokens_used)
            unsettled.add_metric([view.name], view.tokens_unsettled)
            cooldown.add_metric([view.name], view.cooldown_s)
        yield from (active, limit, reserved, used, unsettled, cooldown)

    def _queue_families(self) -> Iterator[Metric]:
        labels = ["model", "lane"]
        depth = GaugeMetricFamily(
            "sluicegate_queue_depth", "Requests waiting for their turn.", labels=labels
        )
        oldest = GaugeMetricFamily(
            "sluicegate_queue_oldest_age_seconds",
            "Age of the oldest waiting request.",
            labels=labels,
        )
        age_limit = GaugeMetricFamily(
            "sluicegate_queue_age_limit_seconds",
            "The lane's max_queue_age_s: a request queued longer is dropped.",
            labels=labels,
        )
        dispatched = CounterMetricFamily(
            "sluicegate_dispatched", "Attempts dispatched.", labels=labels
        )
        queue_dispatched = CounterMetricFamily(
            "sluicegate_queue_dispatched",
            "Attempts dispatched after waiting in the lane's queue (the rest went at once).",
            labels=labels,
        )
        expired = CounterMetricFamily(
            "sluicegate_queue_expired",
            "Queued requests dropped before dispatch (deadline or age limit).",
            labels=labels,
        )
        shed = CounterMetricFamily(
            "sluicegate_queue_shed",
            "Queued requests shed because the lane's queue kept them past its promise.",
            labels=labels,
        )
        unavailable = CounterMetricFamily(
            "sluicegate_queue_unavailable",
            "Queued requests answered before their wait ended because every deployment "
            "named a time past it (an open circuit, a rate limit's next slot), with that "
            "time as Retry-After.",
            labels=labels,
        )
        abandoned = CounterMetricFamily(
            "sluicegate_queue_abandoned",
            "Queued requests cancelled before their turn (the caller left, a hedge's other "
            "attempt won, a job was stopped).",
            labels=labels,
        )
        preempted = CounterMetricFamily(
            "sluicegate_preempted",
            "Streams of the lane (of a tenant at or beyond its share, or below the top lane) "
            "that agreed to give their engine slot to a top-lane request within its share, "
            "to continue their answer later.",
            labels=labels,
        )
        correction = GaugeMetricFamily(
            "sluicegate_queue_wait_correction",
            "Learnt ratio of real to predicted queue waits (1: the predictor is right), of "
            "requests within their tenant's share and beyond it.",
            labels=[*labels, "share"],
        )
        tail = GaugeMetricFamily(
            "sluicegate_queue_wait_tail",
            "How far beyond its corrected prediction one queued wait in ten of requests "
            "beyond their tenant's share ran lately, or went unserved (1: within it); a "
            "lane with a promise admits them by the prediction times this. Forgotten "
            "after a silence.",
            labels=labels,
        )
        service = GaugeMetricFamily(
            "sluicegate_tenant_service",
            "Each tenant's weighted service counter in the fair scheduler (tokens).",
            labels=[*labels, "tenant"],
        )
        reserved = GaugeMetricFamily(
            "sluicegate_reserved_slots",
            "Pool slots kept free for top-lane requests within their tenant's share: work "
            "beyond its share and lower lanes leave them.",
            labels=["model"],
        )
        protected = CounterMetricFamily(
            "sluicegate_protected_requests",
            "Top-lane requests that arrived within their tenant's share.",
            labels=["model"],
        )
        protected_refused = CounterMetricFamily(
            "sluicegate_protected_refused",
            "Of the top-lane requests that arrived within their tenant's share, those "
            "refused, at once or after a wait in the queue, by refusal code.",
            labels=["model", "reason"],
        )
        placements = CounterMetricFamily(
            "sluicegate_placements",
            "Attempts dispatched, by deployment, the model's strategy and why the "
            "deployment was chosen (order, least_loaded, affinity, hash, load_override, "
            "or fallback past the strategy's first choice); models of one deployment are "
            "not counted.",
            labels=["model", "deployment", "strategy", "reason"],
        )
        index_blocks = GaugeMetricFamily(
            "sluicegate_prefix_index_blocks",
            "Prompt blocks prefix_affinity remembers as sent to each deployment.",
            labels=["model", "deployment"],
        )
        hit_ratio = GaugeMetricFamily(
            "sluicegate_prefix_estimated_hit_ratio",
            "Of the prompt blocks prefix_affinity sent, those the chosen deployment had "
            "been sent lately: the gateway's estimate of the backends' prefix-cache hits.",
            labels=["model"],
        )
        for view in (d.view() for d in self._dispatchers):
            placement = view.placement
            for deployment, reasons in placement["chosen"].items():
                for reason, count in reasons.items():
                    key = [view.model, deployment, placement["strategy"], reason]
                    placements.add_metric(key, count)
            for deployment, size in placement.get("index_blocks", {}).items():
                index_blocks.add_metric([view.model, deployment], size)
            if placement.get("estimated_hit_ratio") is not None:
                hit_ratio.add_metric([view.model], placement["estimated_hit_ratio"])
            reserved.add_metric([view.model], view.reserved_slots)
            protected.add_metric([view.model], view.protected_arrivals)
            for reason, count in view.protected_refused.items():
                protected_refused.add_metric([view.model, reason], count)
            for lane in view.lanes:
                key = [view.model, lane.name]
                depth.add_metric(key, lane.queued)
                oldest.add_metric(key, lane.oldest_age_s)
                age_limit.add_metric(key, lane.max_age_s)
                dispatched.add_metric(key, lane.dispatched)
                queue_dispatched.add_metric(key, lane.queue_dispatched)
                expired.add_metric(key, lane.expired)
                shed.add_metric(key, lane.shed)
                unavailable.add_metric(key, lane.unavailable)
                abandoned.add_metric(key, lane.abandoned)
                preempted.add_metric(key, lane.preempted)
                correction.add_metric([*key, "beyond"], lane.wait_correction)
                correction.add_metric([*key, "within"], lane.wait_correction_within_share)
                tail.add_metric(key, lane.wait_tail)
                for tenant, counter in lane.service.items():
                    service.add_metric([*key, tenant], counter)
        yield from (
            depth,
            oldest,
            age_limit,
            dispatched,
            queue_dispatched,
            expired,
            shed,
            unavailable,
        )
        yield from (abandoned, preempted, correction, tail)
        yield from (service, reserved, protected)
        yield from (protected_refused, placements, index_blocks, hit_ratio)

    def _gate_families(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "sluicegate_dispatch_gate",
            "1 for the backend gate's current state (open, closed, stale).",
            labels=["deployment", "state"],
        )
        prefix = GaugeMetricFamily(
            "sluicegate_backend_prefix_hit_ratio",
            "Of the prompt tokens the backend looked up in its prefix cache between its "
            "last two scrapes with any, the share it found (vllm:prefix_cache_hits over "
            "vllm:prefix_cache_queries): beside sluicegate_prefix_estimated_hit_ratio.",
            labels=["deployment"],
        )
        backend = {
            field: GaugeMetricFamily(
                f"sluicegate_backend_{name}",
                f"The backend's {what}, as its last scrape said.",
                labels=["deployment"],
            )
            for field, name, what in BACKEND_GAUGES
        }
        for deployment, gate in self._gates.items():
            current = gate.state()
            for each in GateState:
                state.add_metric([deployment, each.value], 1.0 if each is current else 0.0)
            if not isinstance(gate, MetricsGate):
                continue
            if gate.prefix_hit_ratio is not None:
                prefix.add_metric([deployment], gate.prefix_hit_ratio)
            view = gate.view()
            for field, family in backend.items():
                value = None if view is None else getattr(view, field)
                if value is not None:
                    family.add_metric([deployment], value)
        circuit = GaugeMetricFamily(
            "sluicegate_circuit",
            "1 for the deployment's circuit state (closed, open, half_open).",
            labels=["deployment", "state"],
        )
        opened = CounterMetricFamily(
            "sluicegate_circuit_opened",
            "Times the deployment's circuit opened.",
            labels=["deployment"],
        )
        for view in (d.view() for d in self._dispatchers):
            for target in view.targets:
                name, breaker = target.deployment, target.breaker
                for each in BreakerState:
                    circuit.add_metric([name, each.value], 1.0 if each is breaker.state else 0.0)
                opened.add_metric([name], breaker.opened)
        yield from (state, prefix, *backend.values(), circuit, opened)


class OverloadCollector(Collector):
    def __init__(self, monitor: OverloadMonitor) -> None:
        self._monitor = monitor

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "sluicegate_overload_state",
            "1 for the gateway's current overload state.",
            labels=["state"],
        )
        for each in OverloadState:
            state.add_metric([each.label], 1.0 if each is self._monitor.state else 0.0)
        yield state
        yield GaugeMetricFamily(
            "sluicegate_overload_pressure",
            "Worst ratio of a protected signal to its promise (queue wait, p95 TTFT, TPOT).",
            value=self._monitor.pressure,
        )
        yield CounterMetricFamily(
            "sluicegate_overload_transitions",
            "Changes of overload state.",
            value=self._monitor.transitions,
        )


class StoreCollector(Collector):
    """The shared limit store's state: degraded or not, and the fleet it counts."""

    def __init__(self, store: FailoverStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        view = self._store.view()
        yield GaugeMetricFamily(
            "sluicegate_store_degraded",
            "1 while the shared limit store is unreachable and limits are decided locally.",
            value=1.0 if view.degraded else 0.0,
        )
        yield GaugeMetricFamily(
            "sluicegate_store_live_replicas",
            "Replicas sharing the limit store, as last learned from their heartbeats.",
            value=view.live,
        )
        yield CounterMetricFamily(
            "sluicegate_store_transitions",
            "Changes between shared and degraded decisions.",
            value=view.transitions,
        )
