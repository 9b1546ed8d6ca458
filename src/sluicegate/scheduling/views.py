"""What is a dispatcher doing? Frozen copies for metrics, status and the overload watch.

Readers outside the dispatcher see these alone, never its queues or plug-ins; building
one changes nothing it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluicegate.capacity.breaker import BreakerView
from sluicegate.capacity.gates import GateState
from sluicegate.scheduling.attempt import Target
from sluicegate.scheduling.stats import Exit

if TYPE_CHECKING:
    from sluicegate.scheduling.dispatcher import Dispatcher


@dataclass(frozen=True, slots=True)
class LaneView:
    name: str
    queued: int
    oldest_age_s: float
    in_flight: int
    dispatched: int
    queue_dispatched: int
    expired: int
    service: Mapping[str, float]
    """Each tenant's service counter in the lane's fair order."""
    shed: int
    unavailable: int
    abandoned: int
    preempted: int
    """Streams asked to give their slot to a request within its share and continue
    later."""
    wait_correction: float
    """Real over predicted queue waits of requests beyond their tenant's share, as learnt:
    1 when the predictor is right."""
    wait_correction_within_share: float
    """The same for requests within their tenant's share (they may take the reserve)."""
    wait_tail: float
    """How far beyond its corrected prediction one wait in ten of requests beyond their
    share ran lately, or went unserved (at least 1; forgotten after a silence): a lane
    with a promise admits them by the prediction times this."""
    after_dispatch_s: float
    """Smoothed time from dispatch to the first token of the lane's streamed requests."""
    max_age_s: float
    """The lane's `max_queue_age_s`: a request queued longer is dropped."""


@dataclass(frozen=True, slots=True)
class TargetView:
    deployment: str
    breaker: BreakerView
    gate: GateState
    prefill_pending_tokens: int | None
    """Streamed prompt tokens this dispatcher sent and not yet at their first token;
    None without a prefill budget (no promise on the top lane)."""
    prefill_tokens_per_s: float | None
    """The prefill throughput the deployment's budget learnt from first tokens, as last
    heard; None before any."""


@dataclass(frozen=True, slots=True)
class DispatcherView:
    model: str
    lanes: tuple[LaneView, ...]
    targets: tuple[TargetView, ...]
    service_gap_s: float | None
    """The smoothed gap between dispatches while work waited (the service gap)."""
    checks: Mapping[str, Any]
    reserved_slots: int
    """Pool slots that work beyond its share (and lower lanes) leaves free for top-lane
    requests within their tenant's share."""
    protected_arrivals: int
    """Top-lane requests that arrived within their tenant's share."""
    protected_refused: Mapping[str, int]
    """Of those, the ones refused, at once or after a wait, by refusal code."""
    decode_s_per_token: float | None
    """The engine time an output token costs, as learnt (`demand.EngineUnit`); None
    before a stream ended."""
    prefill_s_per_token: float | None
    """The engine time a prompt token costs, as learnt from the streams; None before
    they tell it."""
    placement: Mapping[str, Any]
    """The model's strategy, the deployments chosen by reason, and what the strategy
    keeps (`routing.Routing.view`)."""


def dispatcher_view(d: Dispatcher) -> DispatcherView:
    """What `d` is doing, from its plug-ins' own views."""
    reserved, arrivals = d.spares.view()
    unit = d.learner.unit
    return DispatcherView(
        d.model,
        tuple(lane_view(d, lane.name) for lane in d.lanes),
        tuple(_target_view(d, target) for target in d.targets),
        d.rule.predictor.gap_s,
        {c.name: c.view() for c in d.checks},
        reserved,
        arrivals,
        dict(d.stats.protected_refused),
        unit.decode_s_per_token,
        unit.prefill_s_per_token,
        d.routing.view(),
    )


def lane_view(d: Dispatcher, name: str) -> LaneView:
    now = d.clock.now()
    queue, stats = d.queues[name], d.stats.lanes[name]
    oldest = queue.oldest_enqueued_s()
    forecast = d.rule.forecast(name)
    exits = stats.exits
    return LaneView(
        name=name,
        queued=d.queued(name),
        oldest_age_s=0.0 if oldest is None else now - oldest,
        in_flight=stats.in_flight,
        dispatched=stats.dispatched,
        queue_dispatched=stats.queue_dispatched,
        expired=exits[Exit.EXPIRED],
        service=queue.fairness.service(),
        shed=exits[Exit.SHED],
        unavailable=exits[Exit.UNAVAILABLE],
        abandoned=exits[Exit.ABANDONED],
        preempted=0 if d.handover is None else d.handover.preempted[name],
        wait_correction=forecast.correction(within_share=False),
        wait_correction_within_share=forecast.correction(within_share=True),
        wait_tail=forecast.tail(now),
        after_dispatch_s=forecast.after_dispatch_s,
        max_age_s=queue.lane.max_queue_age_s,
    )


def _target_view(d: Dispatcher, target: Target) -> TargetView:
    budget = d.budgets.view(target)
    return TargetView(
        target.deployment.name,
        target.breaker.view(),
        target.gate.state(),
        None if budget is None else budget.pending_tokens,
        None if budget is None else budget.tokens_per_s,
    )
