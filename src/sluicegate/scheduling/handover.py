"""Which stream gives its slot to a request within its share, and may it?

Without preemption a request within its tenant's share that finds every slot taken
waits for a completion. Where a deployment can continue an answer from where it stands
(`resumable`, `providers.resume`), a stream of a lower lane, or of another tenant at or
beyond its share, may instead give its slot away: it ends between two events and its
rest queues first among the requests beyond a share, its caller seeing a pause. Built
only for models with a resumable deployment; elsewhere the dispatcher has none.

A promised stream is asked only while its rest would resume within that promise: two
readings of the pause, and the longer stands. At the rate slots came free lately
(`turnover`), the expected pause; but ends come in clumps, and a rate read just after
one promises the next seconds more than they hold. So also by the streams holding
slots, those asked to give theirs aside (their slots are their takers'): each ends at
the latest when it reaches its `max_tokens` at its pace, and the rest resumes at the
latest when as many of the others as there are rests have. Any other attempt's end only
comes sooner. Both readings are this replica's: another replica's waiters, or a closed
backend gate, may keep a free slot from a rest.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from weakref import WeakSet

from sluicegate.core.clock import Clock
from sluicegate.scheduling.attempt import Attempt
from sluicegate.scheduling.fairness import Shares
from sluicegate.scheduling.plugin import Quiet
from sluicegate.scheduling.queues import LaneQueue, Waiter
from sluicegate.scheduling.turnover import Turnover, latest_free_s

PACED_S = 1.0
"""A stream's own pace is read once it has streamed this long."""
RESUMING_PART = 0.25
"""The part of the batch that may be handed over and not yet resumed at once."""


class Giver:
    """A stream's side of a hand-over, kept by the relay that owns the stream: whether it
    can give its slot away now (`interrupt`, set once the relay relays it: told at
    once, it says whether it can), whether it agreed, and the events it relayed so far,
    about a token each: what it would prefill again after its prompt."""

    __slots__ = ("agreed", "interrupt", "relayed_events")

    def __init__(self) -> None:
        self.agreed = False
        """Asked to give its slot to a request within its share, and agreed; the relay
        clears it when its answer ends or turns to more than text first."""
        self.interrupt: Callable[[], bool] | None = None
        self.relayed_events = 0

    def ask(self) -> bool:
        """Ask it to give its slot away: its relay ends it where the caller's stream
        stands between two events and continues the answer in a new attempt. False when
        the relay declines: its answer is finishing or is not plain text."""
        agreed = self.interrupt is not None and self.interrupt()
        self.agreed = self.agreed or agreed
        return agreed


class Rests:
    """The rest of answers whose streams gave their slots away, each lane's in arrival
    order, outside the fair order: their callers are mid-answer. A few at most: the
    hand-overs under way are bounded."""

    def __init__(self, lanes: Iterable[str]) -> None:
        self._lanes: dict[str, deque[Waiter]] = {lane: deque() for lane in lanes}
        self.count = 0

    def push(self, waiter: Waiter) -> None:
        self._lanes[waiter.lane.name].append(waiter)
        self.count += 1

    def remove(self, waiter: Waiter) -> bool:
        """Take `waiter` out (dispatched or leaving); False if it was not queued."""
        rests = self._lanes[waiter.lane.name]
        if waiter not in rests:
            return False
        rests.remove(waiter)
        self.count -= 1
        return True

    def heads(self) -> list[Waiter]:
        return [rests[0] for rests in self._lanes.values() if rests]

    def size(self, lane: str) -> int:
        return len(self._lanes[lane])

    def queued(self, lane: str, flow: str) -> int:
        """`flow`'s rests waiting in `lane`."""
        rests = self._lanes[lane]
        return sum(waiter.flow == flow for waiter in rests) if rests else 0


class HandOver(Quiet):
    def __init__(
        self,
        batch: int,
        clock: Clock,
        queues: Mapping[str, LaneQueue],
        top_shares: Shares,
        reads_turnover: bool = True,
    ) -> None:
        self._batch = batch
        self._reads_turnover = reads_turnover
        """Off: the pause is read from the running streams' `max_tokens` alone."""
        self._shares = top_shares
        """The top lane's share verdict: a stream of a tenant beyond its share may give
        its slot to a request within one."""
        self._clock = clock
        self._queues = queues
        self.rests = Rests(queues)
        self._given: WeakSet[Waiter] = WeakSet()
        """Waiters a stream gave, or is giving, its slot to: they go first."""
        self._asking: WeakSet[Waiter] = WeakSet()
        """Waiters a stream agreed to give its slot to, until that stream ends."""
        self.turnover = Turnover(clock.now())
        """How often slots come free by themselves: how long a handed-over rest waits."""
        self._streaming: dict[int, Attempt] = {}
        """Streams past their first token: each ends at the latest at its `max_tokens`."""
        self._givers: dict[int, Giver] = {}
        """The side of a hand-over of every stream that may give its slot away."""
        self._resumable: dict[int, tuple[Attempt, Giver]] = {}
        """Streams past their first token that may give their slot away, not yet asked
        to."""
        self._asked: dict[int, Waiter] = {}
        """The waiter each stream that agreed to give its slot away gave it for: when the
        stream ends without giving it (it withdrew: its answer ended or turned to more
        than text), the waiter may ask again."""
        self._at_most = max(1, math.floor(batch * RESUMING_PART))
        """Hand-overs under way (asked, or their rest waiting for a slot) at most: each
        rest takes the next free slot, so this many make it wait that many completions."""
        self.preempted: Counter[str] = Counter()
        """Streams asked, and agreed, to give their slot away, per lane."""

    def first_token(self, attempt: Attempt, ttft_s: float) -> None:
        self._streaming[id(attempt)] = attempt

    def may_give(self, attempt: Attempt, giver: Giver) -> None:
        """`attempt`'s stream, past its first token, may give its slot away: never the
        rest of an answer, whose caller already stood still once."""
        if attempt.call.resumed:
            return
        self._givers[id(attempt)] = giver
        self._resumable[id(attempt)] = (attempt, giver)

    def ended(self, attempt: Attempt) -> None:
        """A slot came free unless the attempt handed it over: that slot is its taker's,
        no rest waits on it."""
        giver = self._givers.pop(id(attempt), None)
        handed = giver is not None and giver.agreed
        if not handed:
            self.turnover.freed(self._clock.now())
        self._streaming.pop(id(attempt), None)
        self._resumable.pop(id(attempt), None)
        waiter = self._asked.pop(id(attempt), None)
        if waiter is not None and not handed:
            self._asking.discard(waiter)

    def gave(self, waiter: Waiter) -> bool:
        """Whether a stream gave, or is giving, its slot to `waiter`."""
        return waiter in self._given

    def asks(self, waiter: Waiter) -> bool:
        """Whether a stream agreed to give its slot to `waiter` and has not ended."""
        return waiter in self._asking

    def queued(self, queue: LaneQueue) -> Callable[[str], int]:
        """Each tenant's waiters in `queue`'s lane, its rests included."""
        lane, rests = queue.lane.name, self.rests
        return lambda flow: queue.queued(flow) + rests.queued(lane, flow)

    def first_turns(self, top: LaneQueue) -> Iterator[Waiter]:
        """Who goes before the lanes' own order: requests within their share a stream is
        giving its slot to (that slot is theirs); then the rest of answers, oldest first,
        whatever their lane and whether it is paused (their callers are mid-answer, and
        a hand-over must not starve the stream it took a slot from)."""
        given = self._given
        yield from _oldest_first(w for w in top.within_share_waiters() if w in given)
        yield from _oldest_first(self.rests.heads())

    def preempt_for(self, head: Waiter, queue: LaneQueue) -> None:
        """Free slots for the requests within their share queued in the top lane, whose
        `head` was refused only because every slot is taken: the head first, then the
        others (they stand behind it for the same slots), as long as streams may give
        theirs and at most `RESUMING_PART` of the batch is handed over and not yet
        resumed: each rest takes the next free slot, so more would each wait longer."""
        pending = len(self._asked) + self.rests.count
        for waiter in (head, *queue.within_share_waiters()):
            if pending >= self._at_most:
                return
            if not self.asks(waiter):
                if not self._preempt_one(waiter, queue, pending):
                    return
                pending += 1

    def _preempt_one(self, waiter: Waiter, queue: LaneQueue, pending: int) -> bool:
        """Ask one stream of a lower lane, or of another tenant at or beyond its share now
        (a newcomer of it would not come within), to give its slot to `waiter` and
        continue later; False when none may. A stream of a promised lane is asked only
        while its rest, behind the `pending` ones, would resume within that promise: its
        answer stands still meanwhile. Lower lanes go first, then the stream with the
        least to prefill again (its prompt and the answer so far): that prefill is the
        engine time the hand-over costs everyone."""
        if not self._resumable:
            return False
        lane, tenant = waiter.lane, waiter.flow
        beyond: dict[str, bool] = {}
        pause_s = self._pause_s(pending)
        queued = self.queued(queue)

        def may_yield(running: Attempt, giver: Giver) -> bool:
            if not running.lane.queue_size or giver.interrupt is None:
                return False
            promise = running.lane.ttft_slo_s
            if promise is not None and pause_s(running) > promise:
                return False
            if running.lane.priority < lane.priority:
                return True
            other = running.call.tenant.name
            if other == tenant:
                return False
            if other not in beyond:
                beyond[other] = not self._shares.within_share(other, queued, self._batch)
            return beyond[other]

        def cheapest(candidate: tuple[Attempt, Giver]) -> tuple[int, int]:
            running, giver = candidate
            return (running.lane.priority, running.call.prompt_tokens + giver.relayed_events)

        candidates = [(a, giver) for a, giver in self._resumable.values() if may_yield(a, giver)]
        for victim, giver in sorted(candidates, key=cheapest):
            del self._resumable[id(victim)]
            if giver.ask():
                self._asked[id(victim)] = waiter
                self._asking.add(waiter)
                self._given.add(waiter)
                self.preempted[victim.lane.name] += 1
                return True
        return False

    def _pause_s(self, pending: int) -> Callable[[Attempt], float]:
        """How long a stream would stand still if it gave its slot away now, its rest
        behind `pending` others: the longer of the two readings (module docstring)."""
        now = self._clock.now()
        expected_s = (pending + 1) * self.turnover.gap_s(now) if self._reads_turnover else 0.0
        soonest: list[float] = []

        def pause_s(victim: Attempt) -> float:
            if math.isinf(expected_s):
                return expected_s
            if not soonest:
                asked = self._asked
                ends = (
                    self._ends_by_s(running, now)
                    for key, running in self._streaming.items()
                    if key not in asked
                )
                soonest.extend(heapq.nsmallest(pending + 2, ends))
            own_s = self._ends_by_s(victim, now)
            return max(expected_s, latest_free_s(soonest, pending, own_s))

        return pause_s

    def _ends_by_s(self, running: Attempt, now: float) -> float:
        """How long `running` may still take: what is left of its `max_tokens` at the
        slower of its own pace since its first bytes (`Giver.relayed_events` counts the
        events after those, each a token at least) and its backend's pace now (a slowdown
        since leaves its own behind). Its own is read only once it has streamed
        `PACED_S`: its first events may come together and read as no time a token.
        Unknown, so endless, with neither."""
        first_s, target = running.first_byte_s, running.target
        if first_s is None or target is None:
            return math.inf
        giver = self._givers.get(id(running))
        produced = 0 if giver is None else giver.relayed_events
        streamed_s = now - first_s
        own_s = streamed_s / max(produced, 1) if streamed_s >= PACED_S else 0.0
        pace_s = max(own_s, target.gate.tpot_s or 0.0)
        if pace_s <= 0.0:
            return math.inf
        left = running.call.reserved_tokens - running.call.prompt_tokens - produced
        return max(0, left) * pace_s


def _oldest_first(waiters: Iterable[Waiter]) -> list[Waiter]:
    return sorted(waiters, key=lambda waiter: waiter.enqueued_s)
