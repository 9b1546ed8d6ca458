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
    for d in dispatchers:
        now = d.clock.now()
        lanes = {}
        for name, queue in d.queues.items():
            oldest = queue.oldest_enqueued_s()
            stats = d.stats[name]
            lanes[name] = {
                "queued": queue.size,
                "oldest_age_s": 0.0 if oldest is None else round(now - oldest, 3),
                "dispatched": stats.dispatched,
                "expired": stats.expired,
            }
        models[d.model] = {"lanes": lanes, "dispatch_interval_s": d.dispatch_interval_s}
    return {
        "overload": {"state": monitor.state.label, "pressure": round(monitor.pressure, 3)},
        "models": models,
        "gates": {name: gate.state().value for name, gate in gates.items()},
    }
