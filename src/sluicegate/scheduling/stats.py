"""What has each lane dispatched, and how did its queued requests leave? Counters the
metrics collector reads at scrape time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt
from sluicegate.scheduling.plugin import Dispatch, Quiet

OnWait = Callable[[str, str, float, float | None, bool], None]
"""Told each dispatch's model, lane, wait, predicted wait and whether it came within
its tenant's share."""


class Exit(Enum):
    """How a queued request left its queue unserved."""

    EXPIRED = "expired"
    """Its deadline or its age limit came."""
    SHED = "shed"
    """Its lane's shedding (CoDel on its queue) refused it."""
    UNAVAILABLE = "unavailable"
    """Every deployment named a time past its wait (an open circuit, a rate limit's next
    slot)."""
    ABANDONED = "abandoned"
    """Cancelled before its turn: the caller left, a hedge's other attempt won, a job
    was stopped."""


@dataclass(slots=True)
class LaneStats:
    dispatched: int = 0
    queue_dispatched: int = 0
    """Of those dispatched, the ones that waited in the queue first."""
    wait_s_total: float = 0.0
    in_flight: int = 0
    exits: Counter[Exit] = field(default_factory=Counter)


class Stats(Quiet):
    def __init__(self, model: str, lanes: Sequence[Lane], on_wait: OnWait | None) -> None:
        self._model = model
        self.lanes = {lane.name: LaneStats() for lane in lanes}
        self._on_wait = on_wait
        self.protected_refused: Counter[str] = Counter()
        """Top-lane requests within their share refused, at once or after a wait, by
        refusal code: an expiry in the queue, the predicted time to first token and a
        full queue call for different remedies."""

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None:
        lane = attempt.lane.name
        stats = self.lanes[lane]
        stats.dispatched += 1
        stats.queue_dispatched += how.backlogged_since_s is not None
        stats.in_flight += 1
        stats.wait_s_total += how.wait_s
        if self._on_wait is not None:
            self._on_wait(self._model, lane, how.wait_s, how.predicted_s, how.within_share)

    def ended(self, attempt: Attempt) -> None:
        self.lanes[attempt.lane.name].in_flight -= 1

    def left(self, lane: Lane, how: Exit) -> None:
        self.lanes[lane.name].exits[how] += 1

    def in_flight(self) -> int:
        return sum(stats.in_flight for stats in self.lanes.values())
