"""Which lane goes next, and where would a newcomer stand?

Lanes go in priority order, except that a starving lane (its oldest request waited past
its `starvation_s`) goes first: strict priority must not starve a lane forever. A
newcomer stands behind every request queued in the lanes above and its own, and in its
own lane behind those the fair order serves first (`LaneQueue.place`), or, within its
tenant's share, behind the others within theirs (`LaneQueue.within_share_place`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from sluicegate.core.call import Call
from sluicegate.core.clock import Clock
from sluicegate.core.types import Lane
from sluicegate.scheduling.queues import LaneQueue, Place


class Turns:
    def __init__(
        self,
        lanes: Sequence[Lane],
        queues: Mapping[str, LaneQueue],
        queued: Callable[[str], int],
        clock: Clock,
        asked_lately: Callable[[str], float],
    ) -> None:
        self._lanes = tuple(lanes)
        self._queues = queues
        self._queued = queued
        self._clock = clock
        self._asked_lately = asked_lately

    def lanes(self) -> list[Lane]:
        """The lanes in the order they go now."""
        now = self._clock.now()

        def starving(lane: Lane) -> bool:
            oldest = self._queues[lane.name].oldest_enqueued_s()
            return (
                lane.starvation_s is not None
                and oldest is not None
                and now - oldest > lane.starvation_s
            )

        return sorted(self._lanes, key=lambda lane: not starving(lane))

    def queued_ahead(self, lane: Lane) -> int:
        """Requests queued in `lane` and every lane at or above it (`queued`: a lane's
        waiting requests)."""
        queued = self._queued
        return sum(queued(other.name) for other in self._lanes if other.priority >= lane.priority)

    def place(self, call: Call, within_share: bool) -> Place:
        """Where `call` would wait if it queued now."""
        lane = call.lane
        own = self._queues[lane.name]
        tenant = call.tenant.name
        place = (
            own.within_share_place(tenant, self._asked_lately)
            if within_share
            else own.place(tenant, bool(call.client_retries))
        )
        above = self.queued_ahead(lane) - self._queued(lane.name)
        return Place(above + place.ahead, place.mine, place.since_s)
