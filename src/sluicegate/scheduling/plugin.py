"""The two shapes a scheduling concern takes in the dispatcher.

A *check* answers "may lane L go to target T now?" and owns the counts it reads:
`taken` records an attempt against them before the dispatcher's first await,
`withdrawn` undoes that for an attempt that did not go out after all (a pool refused
it), and `released` for one that ended. A check that counts nothing has empty ones.

An *observer* hears what happens to requests (`arrived`, `dispatched`, `first_token`,
`ended`) and keeps what it learns; others read it through its own methods or a pure
`view()`. The dispatcher holds both as tuples and calls them in order, so undoing a
dispatch is a loop, never a list of updates kept in step by hand.

This module imports no plug-in: plug-ins import it, never each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from sluicegate.core.errors import GatewayError
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Target


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


class Check(Protocol):
    name: str
    lane_wide: bool
    """Whether it answers for the lane alone, whatever the target: asked once per try,
    before a deployment is chosen."""
    holds_rests: bool
    """Whether the rest of a handed-over answer is held to it: that rest held its slot
    within the lane's limits until it gave it away."""

    def applies(self, target: Target, lane: Lane) -> bool:
        """Whether there is anything to decide or count for `lane` on `target`: asked
        once per pair, since both are fixed at start."""
        ...

    def check(self, target: Target, lane: Lane) -> NotNow | None: ...

    def taken(self, target: Target, lane: Lane, attempt: Attempt) -> None: ...

    def withdrawn(self, target: Target, lane: Lane, attempt: Attempt) -> None: ...

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None: ...

    def view(self) -> Mapping[str, Any]: ...


class Dispatch(NamedTuple):
    """How an attempt went out, as its observers hear it."""

    wait_s: float
    predicted_s: float | None
    """The queue wait it was admitted on; None when it did not queue or none was
    predicted."""
    backlogged_since_s: float | None
    """When its tenant's backlog began; None when it did not queue."""
    within_share: bool
    """It came within its tenant's share."""
    handed_over: bool
    """It took a slot a stream gave away for it: no slot came free for it."""
    still_queued: bool
    """Work still waits in some queue after it."""


@runtime_checkable
class Observer(Protocol):
    def arrived(self, attempt: Attempt, within_share: bool) -> None: ...

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None: ...

    def first_token(self, attempt: Attempt, ttft_s: float) -> None: ...

    def ended(self, attempt: Attempt) -> None: ...


class Quiet:
    """An observer's four events, ignored: a plug-in overrides those it learns from, and
    says when it has nothing to learn in its configuration (`listening`)."""

    listening = True

    def arrived(self, attempt: Attempt, within_share: bool) -> None:
        return None

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None:
        return None

    def first_token(self, attempt: Attempt, ttft_s: float) -> None:
        return None

    def ended(self, attempt: Attempt) -> None:
        return None


def hearing(observers: Iterable[Observer], event: str) -> tuple[Callable[..., None], ...]:
    """The bound `event` handlers of those `observers` that learn from it: the ones `Quiet`
    ignores, and those of an observer not listening, are left out once, not called for
    every request."""
    ignored = getattr(Quiet, event)
    return tuple(
        getattr(observer, event)
        for observer in observers
        if getattr(type(observer), event, None) is not ignored
        and getattr(observer, "listening", True)
    )


def first_refusal(
    checks: tuple[Check, ...], target: Target, lane: Lane, rest: bool
) -> NotNow | None:
    """The first check that refuses; the rest of an answer passes those that do not hold
    rests, though it counts in them."""
    for check in checks:
        if rest and not check.holds_rests:
            continue
        verdict = check.check(target, lane)
        if verdict is not None:
            return verdict
    return None


class Plan(NamedTuple):
    """The checks a lane passes on a target."""

    target: tuple[Check, ...]
    """Asked of each candidate target (the lane-wide ones are asked once per try)."""
    every: tuple[Check, ...]
    """Lane-wide and target checks alike: what counts the attempt, and undoes it."""


class Plans:
    """The checks each lane passes on each target, the same at dispatch and at release:
    chosen once per pair, since both are fixed at start."""

    def __init__(
        self, checks: tuple[Check, ...], lanes: Sequence[Lane], targets: Sequence[Target]
    ) -> None:
        self._checks = checks
        first = targets[:1]
        self.lane_wide = {
            lane.name: tuple(c for c in checks for t in first if c.lane_wide and c.applies(t, lane))
            for lane in lanes
        }
        """Per lane, the checks asked once per try, whatever the target (they read none)."""
        self._plans: dict[tuple[str, str], Plan] = {}

    def of(self, target: Target, lane: Lane) -> Plan:
        key = (lane.name, target.deployment.name)
        plan = self._plans.get(key)
        if plan is None:
            own = tuple(c for c in self._checks if not c.lane_wide and c.applies(target, lane))
            plan = self._plans[key] = Plan(own, self.lane_wide[lane.name] + own)
        return plan
