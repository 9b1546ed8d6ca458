"""Dispatch checks: may lane L go to target T now? If not, why, and until when?

Each check answers that one question with plain values and owns the counts it reads:
`dispatched` records an attempt against them, `withdrawn` undoes that for an attempt
that did not go out after all (a pool refused it), and `released` for one that ended.
Check and record happen in one synchronous step of the dispatcher, so no other attempt
can pass a check between the two. A check that has nothing to decide or count for a lane
on a target (`applies`) is left out of that pair's plan, built once by the dispatcher.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sluicegate.capacity.gates import OpenGate
from sluicegate.core.errors import GatewayError
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Outcome, Target


@dataclass(frozen=True, slots=True)
class NotNow:
    """A check's "not now": the refusal a caller gets, the time it is told to come back
    (only a real one), and when the dispatcher itself should look again."""

    reason: Refusal
    message: str
    retry_after_s: float | None = None
    wake_in_s: float | None = None

    def error(self) -> GatewayError:
        return self.reason.error(self.message, self.retry_after_s)


class DispatchCheck(Protocol):
    name: str

    def applies(self, target: Target, lane: Lane) -> bool:
        """Whether there is anything to decide or count for `lane` on `target`: asked
        once per pair, since both are fixed at start."""
        ...

    def check(self, target: Target, lane: Lane) -> NotNow | None: ...

    def dispatched(self, target: Target, lane: Lane) -> None: ...

    def withdrawn(self, target: Target, lane: Lane) -> None: ...

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None: ...

    def view(self) -> dict[str, Any]: ...


class BreakerCheck:
    """An open circuit refuses until it lets probes through; after a recovery or a
    throttle cooldown the deployment ramps up, admitting only part of its capacity.
    Only an attempt that ended `ok` or `failed` is evidence for the breaker; an
    abandoned one (a probe whose caller left) gives its probe slot back."""

    name = "breaker"

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

    def dispatched(self, target: Target, lane: Lane) -> None:
        target.breaker.started()

    def withdrawn(self, target: Target, lane: Lane) -> None:
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

    def dispatched(self, target: Target, lane: Lane) -> None:
        target.gate.sent()

    def withdrawn(self, target: Target, lane: Lane) -> None:
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


class ShareCheck:
    """A lane with `max_share` < 1 holds at most that share of each pool's concurrency
    while the lanes above it are busy (`busy_above`), so the rest stays for them; while
    they are not, it uses what they leave, the whole pool."""

    name = "lane_share"

    def __init__(self, busy_above: Callable[[Lane], bool] = lambda lane: True) -> None:
        self.in_use: Counter[tuple[str, str]] = Counter()
        """(pool, lane) -> attempts of that lane holding a permit of that pool."""
        self.refused = 0
        self._busy_above = busy_above

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

    def dispatched(self, target: Target, lane: Lane) -> None:
        for pool in target.pools:
            self.in_use[(pool.name, lane.name)] += 1

    def withdrawn(self, target: Target, lane: Lane) -> None:
        for pool in target.pools:
            self.in_use[(pool.name, lane.name)] -= 1

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        self.withdrawn(target, lane)

    def view(self) -> dict[str, Any]:
        in_use = {f"{pool}/{lane}": n for (pool, lane), n in self.in_use.items() if n}
        return {"refused": self.refused, "in_use": in_use}


def default_checks(
    busy_above: Callable[[Lane], bool] = lambda lane: True,
) -> tuple[DispatchCheck, ...]:
    """In the order asked: the cheapest and most telling first."""
    return (BreakerCheck(), GateCheck(), ShareCheck(busy_above))
