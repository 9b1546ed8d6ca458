"""A lane's queue: one queue per tenant, served in the order a fairness policy chooses.

Within a tenant, first attempts go before the retries its clients announce (the
`openai` SDKs send `x-stainless-retry-count`), each in arrival order: under overload a
retry has already spent part of its caller's patience, so of two requests the fresh
one is likelier to be answered in time. Bounded by size here and by age through each
waiter's own timeout; a waiter that leaves (deadline, age, caller gone) is removed at
once and never dispatched.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt
from sluicegate.scheduling.fairness import FairnessPolicy


class Waiter:
    """A queued attempt. Its future is set to None once the attempt was granted what it
    waited for, or to a refusal that was never raised: raising it from the waiting
    frame, which can reach this future, would leave a reference cycle (raise
    `renewed()` instead)."""

    __slots__ = ("attempt", "call", "enqueued_s", "future", "lane", "predicted_s")

    def __init__(self, attempt: Attempt, enqueued_s: float, predicted_s: float | None) -> None:
        self.attempt = attempt
        self.call = attempt.call
        self.lane = attempt.lane
        self.enqueued_s = enqueued_s
        self.predicted_s = predicted_s
        """The wait it was admitted on, to learn from once it is dispatched."""
        self.future: asyncio.Future[GatewayError | None] = (
            asyncio.get_running_loop().create_future()
        )

    @property
    def flow(self) -> str:
        return self.call.tenant.name


class _Flow:
    """One tenant's waiters: first attempts, then retries, each FIFO."""

    __slots__ = ("fresh", "retried")

    def __init__(self) -> None:
        self.fresh: deque[Waiter] = deque()
        self.retried: deque[Waiter] = deque()

    def __bool__(self) -> bool:
        return bool(self.fresh or self.retried)

    def part(self, waiter: Waiter) -> deque[Waiter]:
        return self.retried if waiter.call.client_retries else self.fresh

    def head(self) -> Waiter:
        return self.fresh[0] if self.fresh else self.retried[0]

    def oldest_enqueued_s(self) -> float:
        return min(part[0].enqueued_s for part in (self.fresh, self.retried) if part)


class LaneQueue:
    def __init__(self, lane: Lane, fairness: FairnessPolicy) -> None:
        self.lane = lane
        self.fairness = fairness
        self._flows: dict[str, _Flow] = {}
        self.size = 0
        self.fresh = 0
        """Waiters that are first attempts: the only ones a first attempt queues behind
        within its tenant."""

    @property
    def full(self) -> bool:
        return self.size >= self.lane.queue_size

    def push(self, waiter: Waiter) -> None:
        flow = self._flows.get(waiter.flow)
        if flow is None:
            flow = self._flows[waiter.flow] = _Flow()
        if not flow:
            self.fairness.backlogged(waiter.flow)
        flow.part(waiter).append(waiter)
        self.size += 1
        self.fresh += not waiter.call.client_retries

    def head(self) -> Waiter | None:
        """The next waiter: the fairness policy picks the tenant, its queue the waiter."""
        flow = self.fairness.pick()
        return None if flow is None else self._flows[flow].head()

    def remove(self, waiter: Waiter) -> bool:
        """Take `waiter` out (dispatched or leaving); False if it was not queued."""
        flow = self._flows.get(waiter.flow)
        if not flow:
            return False
        part = flow.part(waiter)
        if part and part[0] is waiter:
            part.popleft()
        else:
            try:
                part.remove(waiter)
            except ValueError:
                return False
        self.size -= 1
        self.fresh -= not waiter.call.client_retries
        if not flow:
            self.fairness.idle(waiter.flow)
        return True

    def served_before(self, flow: str, retried: bool) -> int:
        """How many queued now would be served before a newcomer of `flow`: its own
        flow's first attempts (and its retries, if it is one), and of every other
        backlogged flow as many as that flow's weight lets it send while `flow` sends
        those and the newcomer, at most all it has. Costs are taken as equal, so this is
        the fair order's count, not its tokens."""
        own = self._flows.get(flow)
        mine = 0 if own is None else len(own.fresh) + (len(own.retried) if retried else 0)
        weight = self.fairness.weight
        turns = (mine + 1) / weight(flow)
        ahead = mine
        for name, other in self._flows.items():
            if name != flow and other:
                queued = len(other.fresh) + len(other.retried)
                ahead += min(queued, math.ceil(turns * weight(name)))
        return ahead

    def oldest_enqueued_s(self) -> float | None:
        heads = [flow.oldest_enqueued_s() for flow in self._flows.values() if flow]
        return min(heads, default=None)
