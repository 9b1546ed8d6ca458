"""Pacing: may lane L dispatch now, at its pace?

A lane's own `max_dispatch_rate` spreads its dispatches evenly, so its prefills do not
reach a backend in waves. The rest of a handed-over answer is not held to it: its
caller is mid-answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sluicegate.core.clock import Clock
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.plugin import Dispatch, NotNow, Quiet


class Pacing(Quiet):
    name = "pacing"
    lane_wide = True
    holds_rests = False

    def __init__(self, lanes: Sequence[Lane], clock: Clock) -> None:
        self._rates = {
            lane.name: lane.max_dispatch_rate
            for lane in lanes
            if lane.max_dispatch_rate is not None
        }
        self._clock = clock
        self._next_dispatch_s: dict[str, float] = {}
        self.listening = bool(self._rates)
        """Without a pace to keep, there is nothing to hear."""

    def applies(self, target: Target, lane: Lane) -> bool:
        return lane.name in self._rates

    def check(self, target: Target, lane: Lane) -> NotNow | None:
        paced = self._next_dispatch_s.get(lane.name, 0.0) - self._clock.now()
        if paced > 0:
            return NotNow(Refusal.LANE_PACED, f"lane {lane.name} is paced", paced, paced)
        return None

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None:
        rate = self._rates.get(attempt.lane.name)
        if rate is not None:
            now = self._clock.now()
            earliest = max(self._next_dispatch_s.get(attempt.lane.name, now), now)
            self._next_dispatch_s[attempt.lane.name] = earliest + 1.0 / rate

    def taken(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        return None

    def withdrawn(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        return None

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        return None

    def view(self) -> Mapping[str, Any]:
        """Each paced lane's dispatches per second."""
        return dict(self._rates)
