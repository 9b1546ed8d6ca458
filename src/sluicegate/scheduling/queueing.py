"""May a request queue, and for how long?

A request that finds no slot queues only where waiting is still worth it: its predicted
time to first token (`promise.WaitPredictor`) must fit its lane's promise, and its
predicted wait the lane's age limit; otherwise it is refused at once, which beats a late
answer. Once queued, it waits at most its age limit: in a promised lane, what the
promise leaves after the lane's usual time after dispatch or its own prefill. A queue
that keeps requests waiting past half of that for an interval sheds (CoDel per lane and
tenant, as FQ-CoDel keeps one per flow: a tenant served behind the others' shares sheds
its own late requests, while theirs, on time, cannot hide its queue's sojourn). The
predictor learns from every dispatch and first token it hears.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

from sluicegate.core.call import Call
from sluicegate.core.clock import Clock
from sluicegate.core.errors import GatewayError
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt
from sluicegate.scheduling.plugin import Dispatch, Quiet
from sluicegate.scheduling.promise import LaneForecast, QueueExit, Shedder, WaitPredictor
from sluicegate.scheduling.queues import LaneQueue, Place, Waiter

CODEL_TARGET = 0.5
"""CoDel's target as a fraction of the queue budget. A request that waits the whole
budget expires (`age_limit_s`); a queue whose requests keep waiting past half of it
for an interval is running late and sheds before they do."""


class QueueRule(Quiet):
    def __init__(
        self,
        lanes: Sequence[Lane],
        batch: int,
        clock: Clock,
        prefill_rates: Callable[[], list[float]],
        predicts: bool = True,
    ) -> None:
        self.predictor = WaitPredictor()
        self._predicts = predicts
        """Off: a request that finds no slot queues (within the lane's size) and waits
        up to its lane's `max_queue_age_s`; nothing is refused on a forecast or shed."""
        self._batch = batch
        """Requests the deployments take at once: before any service gap is measured, a
        promised lane queues at most one such batch."""
        self._now = clock.now
        self._prefill_rates = prefill_rates
        self._shedders: dict[str, dict[str, Shedder]] = {lane.name: {} for lane in lanes}

    def promise(self, call: Call, place: Place, within_share: bool) -> float | None:
        """The wait predicted for `call` if it queues at `place`, or the refusal now when
        its predicted time to first token breaks its lane's promise (its prompt's own
        prefill may alone; beyond its tenant's share, at the lane's tail of waits:
        `WaitPredictor.admitted_wait_s`) or its wait outlasts the lane's age limit (it
        would only expire). No Retry-After: when capacity comes back is not known."""
        if not self._predicts:
            return None
        lane = call.lane
        predictor = self.predictor
        now = self._now()
        wait = predictor.wait_s(
            lane.name, call.tenant.name, place.ahead, place.mine, now, place.since_s, within_share
        )
        promise, own_s = lane.ttft_slo_s, self._own_prefill_s(call)
        if promise is not None and own_s >= promise:
            raise Refusal.OVERLOADED.error(
                f"the prompt alone takes {own_s:.1f}s to prefill at the rate learnt, the "
                f"{lane.name} lane's whole {promise:g}s promise; retry later"
            )
        if wait is None:
            if promise is not None and place.ahead >= self._batch:
                raise Refusal.OVERLOADED.error(
                    f"the {lane.name} lane has a batch of requests waiting and no measure "
                    f"of its service yet to promise {promise:g}s on; retry later"
                )
            return None
        if promise is not None:
            admitted_s = predictor.admitted_wait_s(lane.name, wait, within_share, now)
            ttft_s = predictor.ttft_s(lane.name, admitted_s, own_s)
            if ttft_s > promise:
                raise Refusal.OVERLOADED.error(
                    f"the {lane.name} lane's predicted time to first token, at its "
                    f"waits' tail ({ttft_s:.1f}s), exceeds its {promise:g}s promise; "
                    "retry later"
                )
        if wait > lane.max_queue_age_s:
            raise Refusal.OVERLOADED.error(
                f"the {lane.name} lane's predicted wait ({wait:.1f}s) exceeds its "
                f"{lane.max_queue_age_s:g}s limit; retry later"
            )
        return wait

    def age_limit_s(self, call: Call) -> float:
        """How long `call` may wait queued: its lane's `max_queue_age_s`, and in a
        promised lane no longer than the promise leaves for the queue after its own
        prefill or the lane's usual time after dispatch (`budget_s`): a request that
        waited that long would be served late, on capacity that could serve one on
        time. The rest of an answer waits as long as its deadline allows."""
        lane = call.lane
        if call.resumed:
            return math.inf
        promise = lane.ttft_slo_s
        if promise is None or not self._predicts:
            return lane.max_queue_age_s
        budget_s = self.predictor.budget_s(lane.name, promise, self._own_prefill_s(call))
        return min(lane.max_queue_age_s, budget_s)

    def expired(self, lane: Lane, waited_s: float | None) -> tuple[GatewayError, QueueExit]:
        """The answer to a request of `lane` still queued when its deadline (`waited_s`
        None) or its age limit came, and how it left, as the predictor learns it."""
        if waited_s is None:
            return Refusal.DEADLINE.error(
                f"the request's deadline passed while it waited in the {lane.name} queue"
            ), QueueExit.DEADLINE
        if waited_s < lane.max_queue_age_s:
            return Refusal.EXPIRED.error(
                f"the request waited {waited_s:.2f}s in the {lane.name} queue: served later, "
                f"it would miss the lane's {lane.ttft_slo_s:g}s promise"
            ), QueueExit.DROPPED
        return Refusal.EXPIRED.error(
            f"the request waited {lane.max_queue_age_s:g}s in the {lane.name} queue, "
            "its lane's limit"
        ), QueueExit.DROPPED

    def outlasts(self, refusal: GatewayError, call: Call, enqueued_s: float) -> bool:
        """Every deployment named a time (an open circuit, a rate limit's next slot) and
        it comes after this request would have left the queue: answer now, with that time
        as Retry-After, rather than let the request wait and expire."""
        known = refusal.retry_after_s
        if known is None:
            return False
        leaves_s = min(
            enqueued_s + self.age_limit_s(call), call.deadline_s - call.route.min_attempt_s
        )
        return known > leaves_s - self._now()

    def late(self, queue: LaneQueue) -> Iterator[tuple[Waiter, GatewayError]]:
        """Each tenant's head whose wait its CoDel finds too long, with its refusal. A head
        within its tenant's share is first in line for the next slot: it waits for it
        (until its budget), and the shedding falls on those above their share."""
        lane = queue.lane
        promise = lane.ttft_slo_s
        if promise is None or not self._predicts:
            return
        now = self._now()
        target = self.predictor.budget_s(lane.name, promise) * CODEL_TARGET
        shedders = self._shedders[lane.name]
        for waiter in queue.heads():
            if waiter.within_share:
                continue
            shedder = shedders.get(waiter.flow)
            if shedder is None:
                shedder = shedders[waiter.flow] = Shedder()
            if shedder.should_shed(now, now - waiter.enqueued_s, target):
                yield (
                    waiter,
                    Refusal.SHED.error(
                        f"the {lane.name} queue is shedding: its requests wait longer than "
                        f"its {promise:g}s promise allows; retry later"
                    ),
                )

    def unserved(self, waiter: Waiter, how: QueueExit) -> None:
        """`waiter` leaves its queue unserved: its wait so far is evidence too."""
        if waiter.predicted_s is not None:
            now = self._now()
            lane, waited_s = waiter.lane.name, now - waiter.enqueued_s
            predictor = self.predictor
            predictor.unserved(lane, waiter.within_share, waiter.predicted_s, waited_s, now, how)

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None:
        """One into a slot a stream handed over is no service gap: that gap is the time
        between slots coming free, which queued requests wait on, and counting
        hand-overs would shorten it by their rate."""
        lane, call, now = attempt.lane.name, attempt.call, self._now()
        predictor = self.predictor
        if how.predicted_s is not None:
            predictor.waited(lane, how.within_share, how.predicted_s, how.wait_s, now)
        since_s = how.backlogged_since_s
        if not how.handed_over:
            predictor.dispatched(now, since_s is not None, how.still_queued)
        if since_s is not None and not call.resumed:
            predictor.flow_dispatched(lane, call.tenant.name, now, since_s)

    def first_token(self, attempt: Attempt, ttft_s: float) -> None:
        """The rest of an answer that gave its slot away came after a prefill of the
        answer so far: nothing is learnt from it."""
        after = attempt.first_byte_after_s
        if after is not None and not attempt.call.resumed:
            self.predictor.first_token(attempt.lane.name, after)

    def _own_prefill_s(self, call: Call) -> float:
        """How long `call`'s prompt alone takes to prefill at the fastest rate its
        deployments' budgets learnt; 0 when nothing is learnt, when its first token is
        not seen (not streamed), or when there is no prefill budget."""
        if not call.stream:
            return 0.0
        rates = self._prefill_rates()
        return call.prompt_tokens / max(rates) if rates else 0.0

    def forecast(self, lane: str) -> LaneForecast:
        """`lane`'s learnt forecast, a fresh one before any: read, never created."""
        return self.predictor.lanes.get(lane) or LaneForecast()
