"""What the dispatcher can promise a request before it queues, and when a queue sheds.

A queued request's wait is predicted from its place in the fair order (`LaneQueue.
served_before`) and the dispatcher's measured service gap: the time between dispatches
while work was waiting, so idle time never makes a busy backend look slow, and never
less than the time since the last dispatch, so a stalled backend is seen at once. A
tenant that keeps a backlog is also held to its own pace, the gap between its own
dispatches within that backlog: above its share it is passed by every newcomer below
theirs, which its place in the order cannot foresee and its pace shows. Each
request dispatched from a queue compares its real wait with the prediction it was
admitted on; the ratio, smoothed in log space and bounded, corrects later predictions,
so an estimate that is wrong in one direction cannot stay wrong. A request that leaves
the queue unserved (expired, shed) after waiting longer than predicted counts too, its
wait so far as the real one: learning from the served alone, a predictor whose
requests all expire would never see it was wrong. The correction centres the
prediction; a request beyond its tenant's share is admitted by the tail: the 90th
percentile of real over corrected predicted waits of such requests, one its queue
dropped counted beyond it. A queue whose waits scatter (some served at once, others
left to expire) takes of them only what nine in ten would be served in time for, and
refuses the rest at once instead of after a wait; after a silence it forgets. A request
within its share is promised its place and admitted by the centre: a tail of its own
would move refusals onto the tenants the share protects. Requests within their
tenant's share and beyond it are corrected apart: the first may take the slots kept
free for them (`reserve`), the others wait for what those leave, and one ratio for
both would fit neither. The time from dispatch to the first token (the backend's own
queue and prefill) is measured per lane too, its mean and its 95th percentile, and a
request is queued only when the wait and that percentile together fit its lane's
`ttft_slo_s`; a streamed prompt whose own prefill, at the fastest rate its deployments'
prefill budgets learnt, takes longer than that percentile is judged by its prefill
instead, and may wait only what the promise leaves beyond it.

Shedding is the second line: CoDel (RFC 8289) on each lane's queue, with the lane's
whole queue budget (the promise less the time after dispatch) as its target. A backend
that slows down suddenly leaves requests waiting past that budget; once they have for an
interval, the queue sheds from its head at CoDel's rising rate, instead of letting every
queued request miss its promise and wait out `max_queue_age_s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

GAP_SMOOTHING = 0.2
"""Weight of the newest gap between dispatches in the smoothed service gap."""
CORRECTION_SMOOTHING = 0.1
"""Weight of the newest real-over-predicted wait ratio (in log space)."""
MAX_CORRECTION = 8.0
"""The correction stays within [1/8, 8]: one odd wait cannot make the predictor absurd."""
TAIL_QUANTILE = 0.9
"""A queue admits a request beyond its share when nine in ten of such recent waits,
scaled to this request's prediction, would fit what it may wait."""
TAIL_STEP = 0.2
"""Each wait moves the tail's log by this, up by the quantile's weight when the wait ran
beyond it and down by the rest when not: a run of unserved requests lifts it within a
few, and a hundred served on time bring it back from its bound to the prediction."""
TAIL_QUIET_S = 10.0
"""After this long without a wait to learn from, the tail's log starts to halve, every
`TAIL_QUIET_S` again. A tail lifted high admits few requests beyond their share, so few
waits come to bring it down: without forgetting, an overload long over would keep
refusing requests a short queue could serve. Only silence is forgotten: decaying
between waits as they come would bias the percentile low (a 67th to 80th at one to
two waits a second)."""
SOONEST_S = 0.005
"""Waits below this are noise for the ratio (a request dispatched on the next turn)."""
AFTER_DISPATCH_SMOOTHING = 0.2
AFTER_DISPATCH_QUANTILE = 0.95
"""The promise is kept at the 95th percentile, so the time after dispatch it leaves room
for is that percentile's, not the mean: with long prompts batched together it varies
2-3x, and a budget cut from the mean let one admitted request in ten or so arrive
late."""
QUANTILE_STEP = 0.05
"""Each sample moves the percentile's estimate by this share of the mean, up by the
quantile's weight when above it and down by the rest when below (stochastic
approximation: it settles where 95 % of samples fall below)."""
MIN_INTERVAL_S = 0.1
"""CoDel's interval: the budget's half, but never shorter than this."""


class QueueExit(Enum):
    """How a queued request left its queue, as the predictor learns from it."""

    SERVED = "served"
    DROPPED = "dropped"
    """Expired at its queue budget or age limit, or shed: the queue gave up on it."""
    DEADLINE = "deadline"
    """Its caller's deadline passed first."""


@dataclass(slots=True)
class FlowPace:
    """One tenant's own service gap within its current backlog in a lane."""

    gap_s: float | None = None
    last_dispatch_s: float = -math.inf


@dataclass(slots=True)
class LaneForecast:
    """One lane's learnt state: how wrong the predictions were, and how long the
    backend takes from dispatch to the first token."""

    log_corrections: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Learnt log ratios of real over predicted waits, beyond (0) and within (1) share."""
    log_tail: float = 0.0
    """The `TAIL_QUANTILE` of those log ratios beyond share, never below 0, as at
    `tail_at_s`."""
    tail_at_s: float = 0.0
    after_dispatch_s: float = 0.0
    after_dispatch_p95_s: float = 0.0
    flows: dict[str, FlowPace] = field(default_factory=dict)

    def correction(self, within_share: bool) -> float:
        return math.exp(self.log_corrections[within_share])

    def tail(self, now: float) -> float:
        return math.exp(self._log_tail(now))

    def _log_tail(self, now: float) -> float:
        quiet_s = now - self.tail_at_s - TAIL_QUIET_S
        return self.log_tail if quiet_s <= 0 else self.log_tail * 0.5 ** (quiet_s / TAIL_QUIET_S)

    def learn(self, within_share: bool, log_ratio: float, how: QueueExit, now: float) -> None:
        """One queued request's real wait over its prediction (`log_ratio`). An unserved
        one's real wait is unknown beyond `log_ratio`: it moves the correction only when
        it waited longer than predicted. Dropped by its queue, it counts beyond the tail
        whatever it waited, as queueing it served nobody; gone at its caller's deadline,
        only when it waited beyond the tail (the deadline is the caller's, not the
        queue's)."""
        log_ratio = _bounded(log_ratio)
        served = how is QueueExit.SERVED
        if served or log_ratio > 0:
            corrections = self.log_corrections
            learnt = corrections[within_share] + CORRECTION_SMOOTHING * log_ratio
            corrections[within_share] = _bounded(learnt)
        if within_share:
            return
        tail = self._log_tail(now)
        above = how is QueueExit.DROPPED or log_ratio > tail
        if how is QueueExit.DEADLINE and not above:
            return
        tail = _quantile_step(tail, above, TAIL_QUANTILE, TAIL_STEP)
        self.log_tail = min(max(tail, 0.0), math.log(MAX_CORRECTION))
        self.tail_at_s = now


class WaitPredictor:
    """The dispatcher's service gap and each lane's correction; times on its clock."""

    def __init__(self) -> None:
        self.gap_s: float | None = None
        self._last_dispatch_s: float | None = None
        self._backlogged = False
        self.lanes: dict[str, LaneForecast] = {}

    def lane(self, name: str) -> LaneForecast:
        forecast = self.lanes.get(name)
        if forecast is None:
            forecast = self.lanes[name] = LaneForecast()
        return forecast

    def dispatched(self, now: float, from_queue: bool, still_queued: bool) -> None:
        """A dispatch: its gap counts only when work waited across it (the previous one
        left a queue behind and this one came from a queue)."""
        last = self._last_dispatch_s
        if from_queue and self._backlogged and last is not None:
            gap = now - last
            smoothed = self.gap_s
            self.gap_s = gap if smoothed is None else smoothed + GAP_SMOOTHING * (gap - smoothed)
        self._last_dispatch_s = now
        self._backlogged = still_queued

    def flow_dispatched(self, lane: str, flow: str, now: float, backlogged_since_s: float) -> None:
        """A dispatch of `flow` from a backlog it has kept since `backlogged_since_s`: its
        gap counts only within one backlog. A dispatch that did not queue need not be told:
        the flow had no backlog, so the next one begins after it."""
        flows = self.lane(lane).flows
        pace = flows.get(flow)
        if pace is None:
            pace = flows[flow] = FlowPace()
        last, pace.last_dispatch_s = pace.last_dispatch_s, now
        if backlogged_since_s > last:
            pace.gap_s = None
            return
        gap, smoothed = now - last, pace.gap_s
        pace.gap_s = gap if smoothed is None else smoothed + GAP_SMOOTHING * (gap - smoothed)

    def wait_s(
        self,
        lane: str,
        flow: str,
        ahead: int,
        mine: int,
        now: float,
        backlogged_since_s: float | None = None,
        within_share: bool = False,
    ) -> float | None:
        """The predicted wait of a newcomer of `flow` with `ahead` requests served before
        it, `mine` of them its own flow's, which has been backlogged since
        `backlogged_since_s` (None: it is not), coming within its share or not; None
        before any gap was measured (nothing to go on: the lane's limits decide)."""
        gap = self.gap_s
        if gap is None:
            return None
        last = self._last_dispatch_s
        if self._backlogged and last is not None:
            gap = max(gap, now - last)
        forecast = self.lane(lane)
        wait = (ahead + 1) * gap
        pace = forecast.flows.get(flow)
        if (
            backlogged_since_s is not None
            and pace is not None
            and pace.gap_s is not None
            and pace.last_dispatch_s >= backlogged_since_s
        ):
            wait = max(wait, (mine + 1) * max(pace.gap_s, now - pace.last_dispatch_s))
        return wait * forecast.correction(within_share)

    def admitted_wait_s(self, lane: str, wait_s: float, within_share: bool, now: float) -> float:
        """The wait a queue is admitted to by: `wait_s` itself within share, at the
        lane's tail beyond it."""
        return wait_s if within_share else wait_s * self.lane(lane).tail(now)

    def ttft_s(self, lane: str, wait_s: float, own_prefill_s: float = 0.0) -> float:
        """The time to first token of a request that waits `wait_s`, as the promise reads
        it: with the 95th percentile of the time after dispatch, or the request's own
        prefill (`own_prefill_s`) when that is longer."""
        return wait_s + self._after_dispatch_s(lane, own_prefill_s)

    def waited(
        self, lane: str, within_share: bool, predicted_s: float, real_s: float, now: float
    ) -> None:
        """A queued request was dispatched at `now`: learn how far off its prediction was."""
        ratio = _log_ratio(real_s, predicted_s)
        self.lane(lane).learn(within_share, ratio, QueueExit.SERVED, now)

    def unserved(
        self,
        lane: str,
        within_share: bool,
        predicted_s: float,
        waited_s: float,
        now: float,
        how: QueueExit,
    ) -> None:
        """A queued request left unserved at `now` after `waited_s` (`how` it left):
        its real wait was longer, so a prediction it outlasted was too short by at least
        that much, and one dropped by its queue was admitted for nothing."""
        ratio = _log_ratio(waited_s, predicted_s)
        self.lane(lane).learn(within_share, ratio, how, now)

    def first_token(self, lane: str, after_dispatch_s: float) -> None:
        """A streamed request's first token came `after_dispatch_s` after its dispatch."""
        forecast = self.lane(lane)
        if forecast.after_dispatch_s == 0.0:
            forecast.after_dispatch_s = forecast.after_dispatch_p95_s = after_dispatch_s
            return
        forecast.after_dispatch_s += AFTER_DISPATCH_SMOOTHING * (
            after_dispatch_s - forecast.after_dispatch_s
        )
        p95 = forecast.after_dispatch_p95_s
        step = QUANTILE_STEP * forecast.after_dispatch_s
        p95 = _quantile_step(p95, after_dispatch_s > p95, AFTER_DISPATCH_QUANTILE, step)
        forecast.after_dispatch_p95_s = max(0.0, p95)

    def budget_s(self, lane: str, ttft_slo_s: float, own_prefill_s: float = 0.0) -> float:
        """How long a request of `lane` may wait in its queue and still meet the promise:
        what the 95th percentile of the time after dispatch leaves, at least a tenth of
        the promise (a percentile swollen by a few slow first tokens must not close the
        queue), and never more than the request's own prefill leaves, which has no
        floor: that prefill is the least it takes, whatever the lane's percentile."""
        usual = max(ttft_slo_s - self.lane(lane).after_dispatch_p95_s, ttft_slo_s * 0.1)
        return max(0.0, min(usual, ttft_slo_s - own_prefill_s))

    def _after_dispatch_s(self, lane: str, own_prefill_s: float) -> float:
        """The lane's percentile speaks for its typical prompt; a prompt longer than most
        takes at least its own prefill, however the lane's others fare."""
        return max(self.lane(lane).after_dispatch_p95_s, own_prefill_s)


def _quantile_step(estimate: float, above: bool, quantile: float, step: float) -> float:
    """Stochastic approximation of a quantile: up by its weight when a sample lies above
    the estimate, down by the rest when not, so it settles where that share lies below."""
    return estimate + step * (quantile if above else quantile - 1.0)


def _log_ratio(real_s: float, predicted_s: float) -> float:
    return math.log(max(real_s, SOONEST_S) / max(predicted_s, SOONEST_S))


def _bounded(log_ratio: float) -> float:
    bound = math.log(MAX_CORRECTION)
    return max(-bound, min(bound, log_ratio))


class Shedder:
    """CoDel on one lane's queue: told each head's sojourn when the dispatcher looks at
    it, it says whether to shed that head instead."""

    def __init__(self) -> None:
        self._first_above_s: float | None = None
        self.dropping = False
        self._drop_next_s = 0.0
        self._count = 0
        self._last_count = 0
        self.shed = 0

    def should_shed(self, now: float, sojourn_s: float, target_s: float) -> bool:
        interval = max(MIN_INTERVAL_S, target_s / 2)
        ok_to_drop = self._above_for_an_interval(now, sojourn_s, target_s, interval)
        if self.dropping:
            if not ok_to_drop:
                self.dropping = False
                return False
            if now < self._drop_next_s:
                return False
            self._count += 1
            self._drop_next_s = now + interval / math.sqrt(self._count)
            self.shed += 1
            return True
        if not ok_to_drop:
            return False
        self.dropping = True
        recent = self._count - self._last_count
        self._count = recent if recent > 1 and now - self._drop_next_s < 16 * interval else 1
        self._last_count = self._count
        self._drop_next_s = now + interval / math.sqrt(self._count)
        self.shed += 1
        return True

    def _above_for_an_interval(
        self, now: float, sojourn_s: float, target_s: float, interval_s: float
    ) -> bool:
        if sojourn_s < target_s:
            self._first_above_s = None
            return False
        if self._first_above_s is None:
            self._first_above_s = now + interval_s
            return False
        return now >= self._first_above_s
