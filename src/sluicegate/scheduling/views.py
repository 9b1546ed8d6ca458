"""What is a dispatcher doing? Frozen copies for metrics, status and the overload watch.

Readers outside the dispatcher see these alone, never its queues or plug-ins; building
one changes nothing it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluicegate.capacity.breaker import BreakerView
from sluicegate.capacity.gates import GateState


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
    slot_costs: Mapping[str, float]
    """What a slot of each tenant seen costs the engine, relative to the average tenant's:
    its requests in flight count by it in the lane's fair shares."""
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
    yields: bool
    """Whether the lower lanes yield to the top lane's time-to-first-token target."""
    yield_rate_per_s: float | None
    """Their allowed dispatch rate while they yield; None while not limited."""
    yield_cuts: int
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
