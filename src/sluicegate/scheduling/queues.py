"""A lane's queue: one FIFO per tenant, served in the order a fairness policy chooses.

Bounded by size here and by age through each waiter's own timeout; a waiter that
leaves (deadline, age, caller gone) is removed at once and never dispatched.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from sluicegate.core.call import Call
from sluicegate.core.types import Lane
from sluicegate.scheduling.fairness import FairnessPolicy

G = TypeVar("G")


class Waiter(Generic[G]):
    """A queued request; its future receives the grant that lets it run."""

    __slots__ = ("call", "enqueued_s", "future", "lane")

    def __init__(self, call: Call, lane: Lane, enqueued_s: float) -> None:
        self.call = call
        self.lane = lane
        self.enqueued_s = enqueued_s
        self.future: asyncio.Future[G] = asyncio.get_running_loop().create_future()

    @property
    def flow(self) -> str:
        return self.call.tenant.name


class LaneQueue(Generic[G]):
    def __init__(self, lane: Lane, fairness: FairnessPolicy) -> None:
        self.lane = lane
        self.fairness = fairness
        self._flows: dict[str, deque[Waiter[G]]] = {}
        self.size = 0

    @property
    def full(self) -> bool:
        return self.size >= self.lane.queue_size

    def push(self, waiter: Waiter[G]) -> None:
        flow = self._flows.get(waiter.flow)
        if flow is None:
            flow = self._flows[waiter.flow] = deque()
        if not flow:
            self.fairness.backlogged(waiter.flow)
        flow.append(waiter)
        self.size += 1

    def head(self) -> Waiter[G] | None:
        """The next waiter by the fairness policy: FIFO within its tenant."""
        flow = self.fairness.pick()
        return None if flow is None else self._flows[flow][0]

    def remove(self, waiter: Waiter[G]) -> bool:
        """Take `waiter` out (dispatched or leaving); False if it was not queued."""
        flow = self._flows.get(waiter.flow)
        if not flow:
            return False
        if flow[0] is waiter:
            flow.popleft()
        else:
            try:
                flow.remove(waiter)
            except ValueError:
                return False
        self.size -= 1
        if not flow:
            self.fairness.idle(waiter.flow)
        return True

    def oldest_enqueued_s(self) -> float | None:
        heads = [flow[0].enqueued_s for flow in self._flows.values() if flow]
        return min(heads, default=None)
