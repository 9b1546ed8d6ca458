"""The admin status document: what the scheduler is doing now, for an operator."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from sluicegate.capacity.gates import BackendGate, MetricsGate
from sluicegate.capacity.pools import Pool
from sluicegate.core.slo import attainment
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.overload import OverloadMonitor
from sluicegate.spend.prices import cost_per_success


def snapshot(
    monitor: OverloadMonitor,
    dispatchers: Iterable[Dispatcher],
    gates: Mapping[str, BackendGate],
    pools: Iterable[Pool],
) -> dict[str, Any]:
    """Read from the same views as the collectors behind `/metrics`, so that the two
    (and the status page, which shows this document) agree."""
    models: dict[str, Any] = {}
    for view in (d.view() for d in dispatchers):
        lanes = {
            lane.name: {
                "queued": lane.queued,
                "oldest_age_s": round(lane.oldest_age_s, 3),
                "in_flight": lane.in_flight,
                "dispatched": lane.dispatched,
                "queue_dispatched": lane.queue_dispatched,
                "expired": lane.expired,
                "shed": lane.shed,
                "unavailable": lane.unavailable,
                "abandoned": lane.abandoned,
                "preempted": lane.preempted,
                "wait_correction": round(lane.wait_correction, 3),
                "wait_correction_within_share": round(lane.wait_correction_within_share, 3),
                "wait_tail": round(lane.wait_tail, 3),
                "after_dispatch_s": round(lane.after_dispatch_s, 3),
                "service": {tenant: round(v, 3) for tenant, v in lane.service.items()},
            }
            for lane in view.lanes
        }
        deployments = {
            target.deployment: {
                "circuit": target.breaker.state.value,
                "in_flight": target.breaker.in_flight,
                "gate": target.gate.value,
                "prefill_pending_tokens": target.prefill_pending_tokens,
                "prefill_tokens_per_s": target.prefill_tokens_per_s,
                "backend": _backend(gates.get(target.deployment)),
            }
            for target in view.targets
        }
        models[view.model] = {
            "lanes": lanes,
            "deployments": deployments,
            "service_gap_s": view.service_gap_s,
            "reserved_slots": view.reserved_slots,
            "decode_s_per_token": view.decode_s_per_token,
            "prefill_s_per_token": view.prefill_s_per_token,
            "checks": view.checks,
            "placement": view.placement,
        }
    return {
        "overload": {"state": monitor.state.label, "pressure": round(monitor.pressure, 3)},
        "models": models,
        "gates": {name: gate.state().value for name, gate in gates.items()},
        "pools": {
            view.name: {
                "active": view.active,
                "limit": view.limit,
                "cooldown_s": round(view.cooldown_s, 3),
            }
            for view in (pool.view() for pool in pools)
        },
    }


def _backend(gate: BackendGate | None) -> dict[str, Any] | None:
    """The deployment's last scraped metrics; None without a metrics gate or a scrape."""
    view = gate.view() if isinstance(gate, MetricsGate) else None
    if view is None:
        return None
    return {name: None if v is None else round(v, 3) for name, v in asdict(view).items()}


TAKES_MAX = frozenset(
    {
        "oldest_age_s",
        "pressure",
        "service_gap_s",
        "wait_correction",
        "wait_correction_within_share",
        "wait_tail",
        "after_dispatch_s",
        "reserved_slots",
        "prefill_tokens_per_s",
        "decode_s_per_token",
        "prefill_s_per_token",
        "window_s",
        "estimated_hit_ratio",
        "limit",
        "cooldown_s",
        "service",
        "backend",
        "now_s",
    }
)
"""Status fields merged across workers by their largest value (ages, the worst pressure,
the slowest service and the worst correction and tail a worker learnt, and what every worker
sees alike: a pool's limit, the backend's last scrape, the fair counters, the clock's second);
a dict under one of these keys is merged the same way throughout. Numbers are otherwise
summed (queued, in flight, dispatched, queue_dispatched, expired, shed, unavailable,
abandoned, answered, a pool's active attempts, each second's offered, accepted and met)."""


def whole_server(own: int, count: int, documents: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
    """The status of a server of `count` workers from the documents of those that
    answered: which worker answered this request, the server as a whole, and each
    worker's own document."""
    answered = sorted(documents)
    return {
        "worker": own,
        "workers": {
            "count": count,
            "answered": answered,
            "missing": [i for i in range(count) if i not in documents],
        },
        "server": _rated(_merge([documents[i] for i in answered])),
        "per_worker": {str(i): documents[i] for i in answered},
    }


def _merge(values: list[Any], key: str = "") -> Any:
    """Dicts key by key; numbers summed (or the largest, for `TAKES_MAX`); flags true
    when any is; words kept when all agree, else the sorted distinct ones. A value a
    worker does not know yet (None: nothing measured there) is left out."""
    values = [value for value in values if value is not None]
    if not values:
        return None
    first = values[0]
    if isinstance(first, dict):
        keys = dict.fromkeys(k for value in values for k in value)
        inherit = key in TAKES_MAX
        return {k: _merge([v[k] for v in values if k in v], key if inherit else k) for k in keys}
    if isinstance(first, bool):
        return any(values)
    if isinstance(first, int | float):
        return max(values) if key in TAKES_MAX else round(sum(values), 3)
    distinct = sorted({str(v) for v in values})
    return distinct[0] if len(distinct) == 1 else distinct


def _rated(document: Any) -> Any:
    """`document` with every attainment worked out again from its merged counts: a
    ratio of sums, not a sum of ratios; so is every cost per successful request."""
    if isinstance(document, dict):
        if "attainment" in document:
            document["attainment"] = attainment(document["met"], document["accepted"])
        if "cost_per_success_dollars" in document:
            document["cost_per_success_dollars"] = cost_per_success(
                document["success_nanos"], document["priced_successes"]
            )
        for value in document.values():
            _rated(value)
    return document
