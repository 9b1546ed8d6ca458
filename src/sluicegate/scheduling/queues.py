"""A lane's queue: one queue per tenant, served in the order a fairness policy chooses.

Within a tenant, requests that came within its fair share go first, then its other
first attempts, then the retries its clients announce (the `openai` SDKs send
`x-stainless-retry-count`), each in arrival order. A request within the share was
promised the next slot: behind its tenant's older requests from beyond the share,
which must leave the reserve free, it would wait as long as they do. Under overload a
retry has already spent part of its caller's patience, so of two requests the fresh
one is likelier to be answered in time.
Bounded by size here and by age through each waiter's own timeout; a waiter that leaves
(deadline, age, caller gone) is removed at once and never dispatched.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt
from sluicegate.scheduling.fairness import FairnessPolicy


class Waiter:
    """A queued attempt. Its future is set to None once the attempt was granted what it
    waited for, or to a refusal that was never raised: raising it from the waiting
    frame, which can reach this future, would leave a reference cycle (raise
    `renewed()` instead)."""

    __slots__ = (
        "__weakref__",
        "attempt",
        "call",
        "enqueued_s",
        "future",
        "lane",
        "predicted_s",
        "within_share",
    )

    def __init__(
        self,
        attempt: Attempt,
        enqueued_s: float,
        predicted_s: float | None,
        within_share: bool = False,
    ) -> None:
        self.attempt = attempt
        self.call = attempt.call
        self.lane = attempt.lane
        self.enqueued_s = enqueued_s
        self.predicted_s = predicted_s
        """The wait it was admitted on, to learn from once it is dispatched."""
        self.within_share = within_share
        """It came within its tenant's share: it may take the dispatcher's reserve, and
        it is not shed (it is first in line for the next slot)."""
        self.future: asyncio.Future[GatewayError | None] = (
            asyncio.get_running_loop().create_future()
        )

    @property
    def flow(self) -> str:
        return self.call.tenant.name


@dataclass(frozen=True, slots=True)
class Place:
    """A newcomer's place in its lane's queue."""

    ahead: int
    """Queued requests served before it."""
    mine: int
    """Of those, its own tenant's."""
    since_s: float | None
    """When its tenant's current backlog began; None when it has nothing queued."""


class _Flow:
    """One tenant's waiters: those within its share, its other first attempts, then its
    retries, each FIFO."""

    __slots__ = ("fresh", "retried", "since_s", "within_share")

    def __init__(self) -> None:
        self.within_share: deque[Waiter] = deque()
        self.fresh: deque[Waiter] = deque()
        self.retried: deque[Waiter] = deque()
        self.since_s = 0.0
        """When its current backlog began."""

    def __bool__(self) -> bool:
        return bool(self.within_share or self.fresh or self.retried)

    def __len__(self) -> int:
        return len(self.within_share) + len(self.fresh) + len(self.retried)

    def part(self, waiter: Waiter) -> deque[Waiter]:
        if waiter.within_share:
            return self.within_share
        return self.retried if waiter.call.client_retries else self.fresh

    def head(self) -> Waiter:
        return (self.within_share or self.fresh or self.retried)[0]

    def oldest_enqueued_s(self) -> float:
        parts = (self.within_share, self.fresh, self.retried)
        return min(part[0].enqueued_s for part in parts if part)


class LaneQueue:
    def __init__(self, lane: Lane, fairness: FairnessPolicy) -> None:
        self.lane = lane
        self.fairness = fairness
        self._flows: dict[str, _Flow] = {}
        self.size = 0
        self.fresh = 0
        """Waiters that are first attempts: the only ones a first attempt queues behind
        within its tenant."""
        self.within_share = 0
        """Waiters that came within their tenant's share: they go before the others,
        which may not take the slots kept free for them anyway."""

    def push(self, waiter: Waiter) -> None:
        self.size += 1
        flow = self._flows.get(waiter.flow)
        if flow is None:
            flow = self._flows[waiter.flow] = _Flow()
        if not flow:
            self.fairness.backlogged(waiter.flow)
            flow.since_s = waiter.enqueued_s
        flow.part(waiter).append(waiter)
        self.fresh += not waiter.call.client_retries
        self.within_share += waiter.within_share

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
        self.within_share -= waiter.within_share
        if not flow:
            self.fairness.idle(waiter.flow)
        return True

    def place(self, flow: str, retried: bool) -> Place:
        """Where a newcomer of `flow` would stand: its own flow's first attempts (and its
        retries, if it is one) go before it, and of every other backlogged flow as many
        as the fairness policy's order serves first."""
        own = self._flows.get(flow)
        if not own:
            return Place(self._served_before(flow, 0), 0, None)
        mine = len(own.within_share) + len(own.fresh) + (len(own.retried) if retried else 0)
        return Place(self._served_before(flow, mine), mine, own.since_s)

    def within_share_place(self, flow: str, asked: Callable[[str], float]) -> Place:
        """Where a newcomer within its tenant's share would stand: before every request
        beyond a share, so among the requests within theirs alone, in the order
        `within_share_head` serves them: behind those of tenants that asked less lately
        (`asked`), and of those that asked as much, as many as the fair order serves
        first. Its tenant's pace is not its own: that is set by the requests beyond
        the share, which it passes."""
        own = self._flows.get(flow)
        mine = 0 if own is None else len(own.within_share)
        level = asked(flow)
        turns_before = self.fairness.turns_before
        ahead = mine
        for name, other in self._flows.items():
            if name == flow or not (queued := len(other.within_share)):
                continue
            theirs = asked(name)
            if theirs < level:
                ahead += queued
            elif theirs == level:
                ahead += turns_before(flow, mine, name, queued)
        return Place(ahead, mine, None)

    def _served_before(self, flow: str, mine: int) -> int:
        """`mine` and, of each other flow's waiters, as many as the fair order serves
        before a newcomer of `flow` with `mine` of its own ahead of it."""
        turns_before = self.fairness.turns_before
        ahead = mine
        for name, other in self._flows.items():
            if name != flow and (queued := len(other)):
                ahead += turns_before(flow, mine, name, queued)
        return ahead

    def backlogged_since(self, flow: str) -> float | None:
        """When `flow`'s current backlog began; None when it has nothing queued."""
        own = self._flows.get(flow)
        return own.since_s if own else None

    def queued(self, flow: str) -> int:
        """`flow`'s waiters."""
        own = self._flows.get(flow)
        return 0 if own is None else len(own)

    def queued_counts(self) -> dict[str, int]:
        """Every backlogged flow's waiters."""
        return {name: len(flow) for name, flow in self._flows.items() if flow}

    def within_share_head(self, asked: Callable[[str], float]) -> Waiter | None:
        """Of the tenants with requests queued within their share (standing first in
        their tenant's queue), the head of the one that asked least lately (`asked`: a
        steady light tenant before the first requests of a heavy one's burst), and of
        those that asked as little, the one the fair order serves first; None if there
        are none. The fair order's head beyond its share must leave them the reserve,
        and would keep them waiting behind itself."""
        if not self.within_share:
            return None
        levels = {name: asked(name) for name, flow in self._flows.items() if flow.within_share}
        least = min(levels.values())
        chosen = self.fairness.pick_from(name for name, level in levels.items() if level == least)
        return None if chosen is None else self._flows[chosen].head()

    def within_share_waiters(self) -> list[Waiter]:
        """Every waiter within its share, in no particular order."""
        return [waiter for flow in self._flows.values() for waiter in flow.within_share]

    def heads(self) -> list[Waiter]:
        """Every backlogged flow's next waiter."""
        return [flow.head() for flow in self._flows.values() if flow]

    def oldest_enqueued_s(self) -> float | None:
        """The oldest wait of the queued requests: what starvation and overload read."""
        heads = [flow.oldest_enqueued_s() for flow in self._flows.values() if flow]
        return min(heads, default=None)
