"""The target's checks: may lane L go to target T now? If not, why, and until when?

Each check answers that one question with plain values and owns the counts it reads
(`plugin.Check`). Check and record happen in one synchronous step of the dispatcher, so
no other attempt can pass a check between the two. A check that has nothing to decide
or count for a lane on a target (`applies`) is left out of that pair's plan, built once
by the dispatcher.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sluicegate.capacity.gates import OpenGate
from sluicegate.core.clock import Clock
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Outcome, Target
from sluicegate.scheduling.plugin import Check, NotNow, Quiet


class BreakerCheck:
    """An open circuit refuses until it lets probes through; after a recovery or a
    throttle cooldown the deployment ramps up, admitting only part of its capacity.
    Only an attempt that ended `ok` or `failed` is evidence for the breaker; an
    abandoned one (a probe whose caller left) gives its probe slot back."""

    name = "breaker"
    lane_wide = False
    holds_rests = True

    def __init__(self) -> None:
        self.refused: Counter[str] = Counter()

    def applies(self, target: Target, lane: Lane) -> bool:
        return True

    def check(self, target: Target, lane: Lane) -> NotNow | None:
        breaker, name = target.breaker, target.deployment.name
        if not breaker.allows():
            reopens = breaker.reopens_in()
            self.refused["circuit_open"] += 1
            return NotNow(
                Refusal.CIRCUIT_OPEN,
                f"deployment {name} is failing; its circuit is open",
                breaker.spread(reopens),
                reopens,
            )
        full = target.full
        limit = breaker.limit(full)
        if limit < full and breaker.in_flight >= limit:
            cooling = breaker.ramp_starts_in()
            self.refused["ramping"] += 1
            if cooling is not None:
                message = f"deployment {name} is cooling down"
                return NotNow(Refusal.POOL_COOLING, message, breaker.spread(cooling), cooling)
            message = f"deployment {name} is ramping up after a recovery"
            return NotNow(Refusal.RAMPING, message)
        return None

    def taken(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        target.breaker.started()

    def withdrawn(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        target.breaker.abandoned()

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        outcome = attempt.outcome
        if outcome is Outcome.OK or outcome is Outcome.FAILED:
            target.breaker.record(outcome is Outcome.OK)
        else:
            target.breaker.abandoned()

    def view(self) -> dict[str, Any]:
        return {"refused": dict(self.refused)}


class GateCheck:
    """The backend's own signal (its queue, latency, KV cache, or an adaptive limit).
    Only evidence teaches an adaptive limit: an abandoned attempt's latency is not the
    backend's."""

    name = "backend_gate"
    lane_wide = False
    holds_rests = True

    def __init__(self) -> None:
        self.refused = 0

    def applies(self, target: Target, lane: Lane) -> bool:
        """A gate without a backend signal admits everything and counts nothing."""
        return not isinstance(target.gate, OpenGate)

    def check(self, target: Target, lane: Lane) -> NotNow | None:
        if target.gate.admits(lane):
            return None
        self.refused += 1
        return NotNow(Refusal.BACKEND_BUSY, f"deployment {target.deployment.name} is busy")

    def taken(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        target.gate.sent()

    def withdrawn(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        target.gate.withdraw()

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        """Only a streamed attempt's first byte is the backend's latency: a non-streamed
        answer's comes with its whole body, whose time grows with the output asked for,
        so long answers would shrink an adaptive limit for everyone; the rest of an
        answer's comes after a prefill of the answer so far too."""
        outcome = attempt.outcome
        call = attempt.call
        evidence = (
            call.stream
            and not call.resumed
            and (outcome is Outcome.OK or outcome is Outcome.FAILED)
        )
        target.gate.done(attempt.first_byte_after_s if evidence else None)

    def view(self) -> dict[str, Any]:
        return {"refused": self.refused}


class ShareCheck(Quiet):
    """A lane with `max_share` < 1 holds at most that share of each pool's concurrency
    while a lane above it is busy (had an arrival within `busy_for_s`), so the rest
    stays for them; while none is, it uses what they leave, the whole pool. A lane
    counts as busy at the start: a batch submitted before anyone else arrives must not
    take the whole pool from the top lane's first requests."""

    name = "lane_share"
    lane_wide = False
    holds_rests = False

    def __init__(self, lanes: Sequence[Lane], clock: Clock, busy_for_s: float) -> None:
        self.in_use: Counter[tuple[str, str]] = Counter()
        """(pool, lane) -> attempts of that lane holding a permit of that pool."""
        self.refused = 0
        self._lanes = tuple(lanes)
        self._clock = clock
        self._busy_for_s = busy_for_s
        started = clock.now()
        self._arrived_s = {lane.name: started for lane in self._lanes}
        """Each lane's latest arrival."""

    def arrived(self, attempt: Attempt, within_share: bool) -> None:
        self._arrived_s[attempt.lane.name] = self._clock.now()

    def _busy_above(self, lane: Lane) -> bool:
        since = self._clock.now() - self._busy_for_s
        arrived = self._arrived_s
        return any(
            arrived.get(other.name, -math.inf) > since
            for other in self._lanes
            if other.priority > lane.priority
        )

    def applies(self, target: Target, lane: Lane) -> bool:
        """Always: the counts of every lane are shown, not only of those it limits."""
        return True

    def check(self, target: Target, lane: Lane) -> NotNow | None:
        if lane.max_share >= 1.0 or not self._busy_above(lane):
            return None
        for pool in target.pools:
            cap = max(1, math.floor(lane.max_share * pool.limits.max_concurrency))
            if self.in_use[(pool.name, lane.name)] >= cap:
                self.refused += 1
                message = f"lane {lane.name} is at its share of pool {pool.name}"
                return NotNow(Refusal.LANE_SHARE, message)
        return None

    def taken(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        for pool in target.pools:
            self.in_use[(pool.name, lane.name)] += 1

    def withdrawn(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        for pool in target.pools:
            self.in_use[(pool.name, lane.name)] -= 1

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        self.withdrawn(target, lane, attempt)

    def view(self) -> dict[str, Any]:
        in_use = {f"{pool}/{lane}": n for (pool, lane), n in self.in_use.items() if n}
        return {"refused": self.refused, "in_use": in_use}


def default_checks(lanes: Sequence[Lane], clock: Clock, busy_for_s: float) -> tuple[Check, ...]:
    """In the order asked: the cheapest and most telling first."""
    return (BreakerCheck(), GateCheck(), ShareCheck(lanes, clock, busy_for_s))
