"""The admin status document: what the scheduler is doing now, for an operator."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sluicegate.capacity.gates import BackendGate
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.overload import OverloadMonitor


def snapshot(
    monitor: OverloadMonitor,
    dispatchers: Iterable[Dispatcher],
    gates: Mapping[str, BackendGate],
) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for view in (d.view() for d in dispatchers):
        lanes = {
            lane.name: {
                "queued": lane.queued,
                "oldest_age_s": round(lane.oldest_age_s, 3),
                "in_flight": lane.in_flight,
                "dispatched": lane.dispatched,
                "expired": lane.expired,
                "shed": lane.shed,
                "wait_correction": round(lane.wait_correction, 3),
                "after_dispatch_s": round(lane.after_dispatch_s, 3),
            }
            for lane in view.lanes
        }
        deployments = {
            target.deployment: {
                "circuit": target.breaker.state.value,
                "in_flight": target.breaker.in_flight,
                "gate": target.gate.value,
            }
            for target in view.targets
        }
        models[view.model] = {
            "lanes": lanes,
            "deployments": deployments,
            "service_gap_s": view.service_gap_s,
            "checks": view.checks,
        }
    return {
        "overload": {"state": monitor.state.label, "pressure": round(monitor.pressure, 3)},
        "models": models,
        "gates": {name: gate.state().value for name, gate in gates.items()},
    }
