"""The per-model dispatcher: the one place a request may wait for its turn.

A request that finds nobody queued ahead of it in its lane or above is dispatched at
once if a deployment can take it. Otherwise it joins its lane's queue and waits,
within its deadline and its age limit, while the dispatcher serves lanes in
priority order and tenants within a lane in the fairness policy's order. Dispatching
takes every pool permit and token reservation the attempt needs; the attempt owns them
until `release`, which undoes exactly what dispatching recorded. The dispatcher wakes
on events (arrival, release, a backend sample, a rate limit's next slot, a timer on
its clock), never on a polling tick.

Every check and the bookkeeping it guards happen in one synchronous step, before the
first await (the pool permits): a limit store that yields cannot let two attempts pass
a check that only one of them fits.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluicegate.capacity.breaker import BreakerView
from sluicegate.capacity.gates import GateState
from sluicegate.core import keys
from sluicegate.core.call import Call
from sluicegate.core.clock import Clock, Wakeup
from sluicegate.core.errors import GatewayError
from sluicegate.core.limits import Prefill, PrefillState
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.checks import DispatchCheck, NotNow, ShareCheck, default_checks
from sluicegate.scheduling.demand import HORIZON_S, EngineUnit, RecentWork
from sluicegate.scheduling.fairness import FairnessPolicy
from sluicegate.scheduling.promise import QueueExit, Shedder, WaitPredictor
from sluicegate.scheduling.queues import LaneQueue, Place, Waiter
from sluicegate.scheduling.reserve import GONE_AFTER_S, MOST_OF_BATCH, Reserve
from sluicegate.scheduling.turnover import Turnover, latest_free_s
from sluicegate.scheduling.yielding import Yielding

CODEL_TARGET = 0.5
"""CoDel's target as a fraction of the queue budget. A request that waits the whole
budget expires (`_age_limit_s`); a queue whose requests keep waiting past half of it
for an interval is running late and sheds before they do."""
PACED_S = 1.0
"""A stream's own pace is read once it has streamed this long."""
RESUMING_PART = 0.25
"""The part of the batch that may be handed over and not yet resumed at once."""
PREFILL_PART = 0.5
"""The part of the top lane's promise the prompts waiting at a deployment for their
first token may take to prefill together (`core.prefill`): the rest is for the wait in
the queue and the engine step the first token comes in."""


@dataclass(slots=True)
class LaneStats:
    """Counters the metrics collector reads at scrape time."""

    dispatched: int = 0
    queue_dispatched: int = 0
    """Of those dispatched, the ones that waited in the queue first."""
    expired: int = 0
    shed: int = 0
    """Queued requests refused by the lane's shedding (CoDel on its queue)."""
    unavailable: int = 0
    """Queued requests answered before their wait ended: every deployment named a time
    past it (an open circuit, a rate limit's next slot)."""
    abandoned: int = 0
    """Queued requests cancelled before their turn: the caller left, a hedge's other
    attempt won, a job was stopped."""
    preempted: int = 0
    """Streams asked to give their slot to a request within its share and continue later."""
    wait_s_total: float = 0.0
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class LaneView:
    name: str
    queued: int
    oldest_age_s: float
    in_flight: int
    dispatched: int
    queue_dispatched: int
    expired: int
    service: Mapping[str, float]
    """Each tenant's service counter in the lane's fair order."""
    slot_costs: Mapping[str, float]
    """What a slot of each tenant seen costs the engine, relative to the average tenant's:
    its requests in flight count by it in the lane's fair shares."""
    shed: int
    unavailable: int
    abandoned: int
    preempted: int
    wait_correction: float
    """Real over predicted queue waits of requests beyond their tenant's share, as learnt:
    1 when the predictor is right."""
    wait_correction_within_share: float
    """The same for requests within their tenant's share (they may take the reserve)."""
    wait_tail: float
    """How far beyond its corrected prediction one wait in ten of requests beyond their
    share ran lately, or went unserved (at least 1; forgotten after a silence): a lane
    with a promise admits them by the prediction times this."""
    after_dispatch_s: float
    """Smoothed time from dispatch to the first token of the lane's streamed requests."""


@dataclass(frozen=True, slots=True)
class TargetView:
    deployment: str
    breaker: BreakerView
    gate: GateState
    prefill_pending_tokens: int | None
    """Streamed prompt tokens this dispatcher sent and not yet at their first token;
    None without a prefill budget (no promise on the top lane)."""
    prefill_tokens_per_s: float | None
    """The prefill throughput the deployment's budget learnt from first tokens, as last
    heard; None before any."""


@dataclass(slots=True)
class _Prefilling:
    """A deployment's prefill budget as one dispatcher sees it: the budget itself lives
    in the limit store, decided with the pools (`Ask.prefill`), one for every replica
    sending to the deployment."""

    key: str
    pending: int = 0
    """This dispatcher's streamed prompt tokens sent and not yet at their first token."""
    tokens_per_s: float | None = None
    """The budget's learnt throughput, as last heard."""
    prompts: int = 0
    """Prompt tokens that got their first token from this dispatcher so far: those a
    stream's span held cost part of its steps (`EngineUnit.streamed`)."""

    def heard(self, state: PrefillState) -> None:
        self.tokens_per_s = state.tokens_per_s


@dataclass(frozen=True, slots=True)
class DispatcherView:
    """A copy of what the dispatcher is doing now, for metrics and operators."""

    model: str
    lanes: tuple[LaneView, ...]
    targets: tuple[TargetView, ...]
    service_gap_s: float | None
    """The smoothed gap between dispatches while work waited (the service gap)."""
    yields: bool
    """Whether the lower lanes yield to the top lane's time-to-first-token target."""
    yield_rate_per_s: float | None
    """Their allowed dispatch rate while they yield; None while not limited."""
    yield_cuts: int
    checks: Mapping[str, Any]
    reserved_slots: int
    """Pool slots that work beyond its share (and lower lanes) leaves free for top-lane
    requests within their tenant's share."""
    protected_arrivals: int
    """Top-lane requests that arrived within their tenant's share."""
    protected_refused: Mapping[str, int]
    """Of those, the ones refused, at once or after a wait, by refusal code: an expiry
    in the queue, the predicted time to first token and a full queue call for
    different remedies."""
    decode_s_per_token: float | None
    """The engine time an output token costs, as learnt (`demand.EngineUnit`); None
    before a stream ended."""
    prefill_s_per_token: float | None
    """The engine time a prompt token costs, as learnt from the streams; None before
    they tell it."""


class Dispatcher:
    def __init__(
        self,
        model: str,
        lanes: Sequence[Lane],
        targets: Sequence[Target],
        fairness: Callable[[Lane], FairnessPolicy],
        clock: Clock,
        on_wait: Callable[[str, str, float, float | None, bool], None] | None = None,
        paused: Callable[[Lane], bool] = lambda lane: False,
        chain: bool = False,
        checks: Sequence[DispatchCheck] | None = None,
        reserve: float = MOST_OF_BATCH,
    ) -> None:
        self.model = model
        self.lanes = sorted(lanes, key=lambda lane: -lane.priority)
        self.protected = self.lanes[0]
        target = self.protected.ttft_target_s
        self.yielding = None if target is None else Yielding(target, clock)
        self._prefilling: set[int] = set()
        """Streamed top-lane requests dispatched and still waiting for their first token,
        while lower lanes yield: a background prefill sent now would share their engine
        steps and delay exactly the first tokens the target protects."""
        self.queues: dict[str, LaneQueue] = {
            lane.name: LaneQueue(lane, fairness(lane)) for lane in self.lanes
        }
        self.stats = {lane.name: LaneStats() for lane in self.lanes}
        self.predictor = WaitPredictor()
        self._shedders: dict[str, dict[str, Shedder]] = {lane.name: {} for lane in self.lanes}
        """CoDel per lane and tenant, as FQ-CoDel keeps one per flow: a tenant served
        behind the others' shares sheds its own late requests, while theirs, on time,
        cannot hide its queue's sojourn."""
        self.targets = list(targets)
        self._batch = sum(target.full for target in self.targets)
        """Requests the deployments take at once: before any service gap is measured, a
        promised lane queues at most one such batch."""
        self.reserve = Reserve(self._batch, reserve)
        self._protected_refused: Counter[str] = Counter()
        promise = self.protected.ttft_slo_s
        self.unit = EngineUnit()
        self._recent = RecentWork(HORIZON_S if promise is None else promise)
        """Work each tenant asked lately in the top lane: the order among the requests
        within their share."""
        started = clock.now()
        self.turnover = Turnover(started)
        """How often slots come free by themselves: how long a handed-over rest waits."""
        self._prefill_within_s = None if promise is None else PREFILL_PART * promise
        names = [] if promise is None else [target.deployment.name for target in self.targets]
        self._prefill = {name: _Prefilling(keys.prefill(name)) for name in names}
        """Each deployment's prefill budget, holding the prompts waiting for their first
        token to what it prefills within part of the promise; none without a promise."""
        self._spares = _SpareSplit(self.targets)
        """Each deployment's part of the reserve, in proportion to its capacity."""
        self._hands_over = any(target.deployment.resumable for target in self.targets)
        """Whether any stream here may give its slot away: without, the pump's order is
        the lanes' alone."""
        self._streaming: dict[int, Attempt] = {}
        """Streams past their first token: each ends at the latest at its `max_tokens`,
        and a handed-over answer's rest waits for those ends (`_pause_s`). Kept, like
        `turnover`, only where streams may hand over: nothing else reads them."""
        self._resumable: dict[int, Attempt] = {}
        """Streams past their first token that may give their slot away and continue
        later (`providers.resume`), not yet asked to: the slots a request within its
        share may take from work beyond a share or below its lane."""
        self._resuming_at_most = max(1, math.floor(self._batch * RESUMING_PART))
        """Hand-overs under way (asked, or their rest waiting for a slot) at most: each
        rest takes the next free slot, so this many make it wait that many completions."""
        self._asked: dict[int, Waiter] = {}
        """The waiter each stream that agreed to give its slot away gave it for: when the
        stream ends without giving it (it withdrew: its answer ended or turned to more
        than text), the waiter may ask again."""
        self._arrived_s = {lane.name: started for lane in self.lanes}
        """Each lane's latest arrival: a lane's share caps it only while one above is busy.
        A lane counts as busy at the start: a batch submitted before anyone else arrives
        must not take the whole pool from the top lane's first requests."""
        self.checks = tuple(default_checks(self._busy_above) if checks is None else checks)
        self._plans: dict[tuple[str, str], tuple[DispatchCheck, ...]] = {}
        self._chain = chain
        self._turn = itertools.count()
        self.clock = clock
        self._on_wait = on_wait
        self._paused = paused
        self._next_dispatch_s: dict[str, float] = {}
        self._kicked = asyncio.Event()
        self._retry = Wakeup(clock, self.kick)
        """The wake-up for a rate limit's next slot or a cooldown's end."""
        for target in self.targets:
            target.gate.on_change(self.kick)
            for pool in target.pools:
                pool.on_release(self.kick)

    def kick(self) -> None:
        self._kicked.set()

    def view(self) -> DispatcherView:
        now = self.clock.now()
        lanes = []
        for lane in self.lanes:
            queue, stats = self.queues[lane.name], self.stats[lane.name]
            oldest = queue.oldest_enqueued_s()
            forecast = self.predictor.lane(lane.name)
            lanes.append(
                LaneView(
                    name=lane.name,
                    queued=queue.size,
                    oldest_age_s=0.0 if oldest is None else now - oldest,
                    in_flight=stats.in_flight,
                    dispatched=stats.dispatched,
                    queue_dispatched=stats.queue_dispatched,
                    expired=stats.expired,
                    service=queue.fairness.service(),
                    slot_costs=queue.fairness.slot_costs(),
                    shed=stats.shed,
                    unavailable=stats.unavailable,
                    abandoned=stats.abandoned,
                    preempted=stats.preempted,
                    wait_correction=forecast.correction(within_share=False),
                    wait_correction_within_share=forecast.correction(within_share=True),
                    wait_tail=forecast.tail(now),
                    after_dispatch_s=forecast.after_dispatch_s,
                )
            )
        targets = tuple(self._target_view(target) for target in self.targets)
        yielding = self.yielding
        return DispatcherView(
            self.model,
            tuple(lanes),
            targets,
            self.predictor.gap_s,
            yielding is not None,
            None if yielding is None else yielding.rate_per_s,
            0 if yielding is None else yielding.cuts,
            {check.name: check.view() for check in self.checks},
            self.reserve.slots(now, self.predictor.gap_s),
            self.reserve.arrivals,
            dict(self._protected_refused),
            self.unit.decode_s_per_token,
            self.unit.prefill_s_per_token,
        )

    def _target_view(self, target: Target) -> TargetView:
        name = target.deployment.name
        prefilling = self._prefill.get(name)
        return TargetView(
            name,
            target.breaker.view(),
            target.gate.state(),
            None if prefilling is None else prefilling.pending,
            None if prefilling is None else prefilling.tokens_per_s,
        )

    def first_token(self, attempt: Attempt, ttft_s: float) -> None:
        """A streamed request got its first token `ttft_s` after arrival. The rest of an
        answer that gave its slot away came long after its arrival, and after a prefill
        of the answer so far too: nothing is learnt from it but its prefill's end."""
        resumed = attempt.call.resumed
        if self._hands_over:
            self._streaming[id(attempt)] = attempt
        if attempt.dispatched_s is not None and attempt.first_byte_s is not None and not resumed:
            after = attempt.first_byte_s - attempt.dispatched_s
            self.predictor.first_token(attempt.lane.name, after)
        prefilling = self._prefilling_at(attempt)
        if prefilling is not None:
            prefilling.pending -= attempt.call.prompt_tokens
            if not resumed:
                prefilling.prompts += attempt.call.prompt_tokens
            attempt.prompts_seen = prefilling.prompts
            assert attempt.permit is not None
            attempt.permit.first_token(prefilling.heard, learn=not resumed)
        if resumed:
            self._prefilled(attempt)
            return
        if attempt.resumable:
            self._resumable[id(attempt)] = attempt
        if self.yielding is not None and attempt.lane is self.protected:
            self.yielding.observe(ttft_s)
            self._prefilled(attempt)

    def _prefilled(self, attempt: Attempt) -> None:
        """`attempt` no longer waits for its first token: lower lanes may go once none
        does."""
        prefilling = self._prefilling
        if id(attempt) in prefilling:
            prefilling.discard(id(attempt))
            if not prefilling:
                self.kick()

    async def run(self) -> None:
        while True:
            await self._kicked.wait()
            self._kicked.clear()
            await self._pump()

    async def acquire(self, attempt: Attempt) -> None:
        """Grant `attempt` a deployment and its permits, at once or after a wait in its
        lane's queue; raise the refusal otherwise. Once this returns, the attempt is
        the caller's to `release`."""
        lane = attempt.lane
        now = self._arrived_s[lane.name] = self.clock.now()
        protected = self._within_share(attempt)
        if protected:
            self.reserve.arrived(now)
        try:
            await self._admit(attempt, protected)
        except GatewayError as refusal:
            if protected:
                self._protected_refused[refusal.code] += 1
            raise

    async def _admit(self, attempt: Attempt, protected: bool) -> None:
        """`acquire` past the share's verdict: apart, so that every refusal of a request
        judged within its share, at once or after its wait, is counted in one place."""
        call, lane = attempt.call, attempt.lane
        ahead = self._queued_ahead(lane)
        if protected:
            ahead = self.queues[lane.name].protected
        if not ahead and not self._paused(lane):
            refusal = await self._try(attempt, self._spare(protected), queued=False)
            if refusal is None:
                self._dispatched(attempt, 0.0, None, None, protected=protected)
                return
        else:
            refusal = Refusal.LANE_BACKLOGGED.error(
                f"lane {lane.name} has requests waiting ahead of it"
            )
        if lane.queue_size == 0 or self._outlasts(refusal, call, self.clock.now()):
            raise refusal
        predicted_s = None if call.resumed else self._promise(call, protected)
        queue = self.queues[lane.name]
        if queue.full and not call.resumed:
            raise Refusal.QUEUE_FULL.error(f"the {lane.name} queue of {self.model} is full")
        waiter = Waiter(attempt, self.clock.now(), predicted_s, protected)
        queue.push(waiter)
        self.kick()
        await self._wait(waiter, queue)

    async def release(self, attempt: Attempt) -> None:
        """End an attempt: undo what dispatching it recorded, learn from its outcome only
        when it is evidence, and free its permits (settling tokens against its usage)."""
        target = attempt.target
        if target is None:
            return
        if attempt.dispatched_s is None:
            self._unreserve(attempt, self._plan(target, attempt.lane))
        else:
            self._ended(attempt, target)
        attempt.target = None
        permit, attempt.permit = attempt.permit, None
        try:
            if permit is not None:
                await permit.release(attempt.used_tokens)
        finally:
            self.kick()

    def _ended(self, attempt: Attempt, target: Target) -> None:
        """The mirror of `_reserve` and `_dispatched` for an attempt that went out."""
        lane, now = attempt.lane, self.clock.now()
        if self._hands_over and not attempt.preempted:
            self.turnover.freed(now)
        for check in self._plan(target, lane):
            check.released(target, lane, attempt)
        self._prefilled(attempt)
        prefilling = self._prefilling_at(attempt)
        if prefilling is not None:
            prefilling.pending -= attempt.call.prompt_tokens
        budget = self._prefill.get(target.deployment.name)
        rate = None if budget is None else budget.tokens_per_s
        prompts = _prompts_meanwhile(attempt, budget)
        first_s = attempt.first_byte_s
        if (
            attempt.call.stream
            and first_s is not None
            and attempt.completion_tokens
            and prompts is not None
        ):
            sequences = sum(stats.in_flight for stats in self.stats.values())
            self.unit.streamed(
                attempt.completion_tokens,
                now - first_s,
                prompts,
                math.ceil(sequences / len(self.targets)),
                1.0 / rate if rate else None,
            )
        self._streaming.pop(id(attempt), None)
        self._resumable.pop(id(attempt), None)
        waiter = self._asked.pop(id(attempt), None)
        if waiter is not None and not attempt.preempted:
            waiter.preempting = False
        self.stats[lane.name].in_flight -= 1
        produced = attempt.completion_tokens
        if produced is None and attempt.used_tokens is not None:
            produced = max(0, attempt.used_tokens - attempt.call.prompt_tokens)
        fairness = self.queues[lane.name].fairness
        tenant = attempt.call.tenant.name
        fairness.in_flight(tenant, -1)
        if produced is None:
            return
        fairness.charge(tenant, 0, produced - attempt.charged_output)
        if attempt.call.resumed:
            return
        assert attempt.dispatched_s is not None
        work_s = self.unit.work_s(attempt.call.prompt_tokens, produced, rate)
        if work_s is not None:
            fairness.slot_held(tenant, work_s, now - attempt.dispatched_s)

    def _queued_ahead(self, lane: Lane) -> int:
        return sum(
            self.queues[other.name].size for other in self.lanes if other.priority >= lane.priority
        )

    def _place(self, call: Call, protected: bool) -> Place:
        """Where `call` would wait: behind all of the lanes above, and in its own lane
        behind those the fair order serves first (`LaneQueue.place`), or, within its
        tenant's share, behind the others within theirs (`LaneQueue.protected_place`)."""
        lane = call.lane
        own = self.queues[lane.name]
        tenant = call.tenant.name
        place = (
            own.protected_place(tenant, self._asked_lately)
            if protected
            else own.place(tenant, bool(call.client_retries))
        )
        above = self._queued_ahead(lane) - own.size
        return Place(above + place.ahead, place.mine, place.since_s)

    def _outlasts(self, refusal: GatewayError, call: Call, enqueued_s: float) -> bool:
        """Every deployment named a time (an open circuit, a rate limit's next slot) and
        it comes after this request would have left the queue: answer now, with that time
        as Retry-After, rather than let the request wait and expire."""
        known = refusal.retry_after_s
        if known is None:
            return False
        leaves_s = min(
            enqueued_s + self._age_limit_s(call), call.deadline_s - call.route.min_attempt_s
        )
        return known > leaves_s - self.clock.now()

    def _promise(self, call: Call, protected: bool) -> float | None:
        """The wait predicted for `call` if it queues, or the refusal now when its
        predicted time to first token breaks its lane's promise (its prompt's own prefill
        may alone; beyond its tenant's share, at the lane's tail of waits:
        `WaitPredictor.admitted_wait_s`) or its wait outlasts the lane's age limit (it
        would only expire): an honest 'not now' beats a late answer.
        No Retry-After: when capacity comes back is not known."""
        lane = call.lane
        predictor = self.predictor
        place = self._place(call, protected)
        now = self.clock.now()
        wait = predictor.wait_s(
            lane.name, call.tenant.name, place.ahead, place.mine, now, place.since_s, protected
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
            admitted_s = predictor.admitted_wait_s(lane.name, wait, protected, now)
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

    def _shed_late(self, queue: LaneQueue) -> None:
        """Shed each tenant's head whose wait its CoDel finds too long: that tenant's
        queue has kept requests waiting past what the promise allows for an interval.
        A head within its tenant's share is first in line for the next slot: it waits
        for it (until its budget), and the shedding falls on those above their share."""
        lane = queue.lane
        promise = lane.ttft_slo_s
        if promise is None:
            return
        now = self.clock.now()
        target = self.predictor.budget_s(lane.name, promise) * CODEL_TARGET
        shedders = self._shedders[lane.name]
        for waiter in queue.heads():
            if waiter.protected:
                continue
            shedder = shedders.get(waiter.flow)
            if shedder is None:
                shedder = shedders[waiter.flow] = Shedder()
            if not shedder.should_shed(now, now - waiter.enqueued_s, target):
                continue
            if queue.remove(waiter) and not waiter.future.done():
                self._unserved(waiter, now, QueueExit.DROPPED)
                self.stats[lane.name].shed += 1
                waiter.future.set_result(
                    Refusal.SHED.error(
                        f"the {lane.name} queue is shedding: its requests wait longer than "
                        f"its {promise:g}s promise allows; retry later"
                    )
                )

    def _age_limit_s(self, call: Call) -> float:
        """How long `call` may wait queued: its lane's `max_queue_age_s`, and in a
        promised lane no longer than the promise leaves for the queue after its own
        prefill or the lane's usual time after dispatch (`budget_s`): a request that
        waited that long would be served late, on capacity that could serve one on
        time."""
        lane = call.lane
        if call.resumed:
            return math.inf
        promise = lane.ttft_slo_s
        if promise is None:
            return lane.max_queue_age_s
        budget_s = self.predictor.budget_s(lane.name, promise, self._own_prefill_s(call))
        return min(lane.max_queue_age_s, budget_s)

    def _own_prefill_s(self, call: Call) -> float:
        """How long `call`'s prompt alone takes to prefill at the fastest rate its
        deployments' budgets learnt; 0 when nothing is learnt, when its first token is
        not seen (not streamed), or when the top lane has no promise (then there is no
        prefill budget to learn a rate)."""
        if not call.stream:
            return 0.0
        rates = self._prefill_rates()
        return call.prompt_tokens / max(rates) if rates else 0.0

    def _prefill_rates(self) -> list[float]:
        """The deployments' learnt prefill rates, as last heard, where learnt."""
        return [rate for budget in self._prefill.values() if (rate := budget.tokens_per_s)]

    async def _wait(self, waiter: Waiter, queue: LaneQueue) -> None:
        """The intentional wait point: bounded by the request's age limit, as known when
        it queued (a prefill rate learnt later does not move it), and the deadline, both
        timed on the dispatcher's clock."""
        call = waiter.call
        waited_s = self._age_limit_s(call)
        age_limit = waiter.enqueued_s + waited_s
        deadline = call.deadline_s - call.route.min_attempt_s
        timer = self.clock.call_at(
            min(age_limit, deadline),
            lambda: self._expire(waiter, queue, None if deadline <= age_limit else waited_s),
        )
        try:
            refusal = await waiter.future
        except asyncio.CancelledError:
            if queue.remove(waiter):
                self.stats[waiter.lane.name].abandoned += 1
            if _granted(waiter):
                await self.release(waiter.attempt)
            raise
        finally:
            timer.cancel()
        if refusal is not None:
            raise refusal.renewed()

    def _expire(self, waiter: Waiter, queue: LaneQueue, waited_s: float | None) -> None:
        """Answer a request still queued when its deadline (`waited_s` None) or its age
        limit came."""
        if not queue.remove(waiter) or waiter.future.done():
            return
        lane = waiter.lane
        how = QueueExit.DEADLINE if waited_s is None else QueueExit.DROPPED
        self._unserved(waiter, self.clock.now(), how)
        self.stats[lane.name].expired += 1
        if waited_s is None:
            error = Refusal.DEADLINE.error(
                f"the request's deadline passed while it waited in the {lane.name} queue"
            )
        elif waited_s < lane.max_queue_age_s:
            error = Refusal.EXPIRED.error(
                f"the request waited {waited_s:.2f}s in the {lane.name} queue: served later, "
                f"it would miss the lane's {lane.ttft_slo_s:g}s promise"
            )
        else:
            error = Refusal.EXPIRED.error(
                f"the request waited {lane.max_queue_age_s:g}s in the {lane.name} queue, "
                "its lane's limit"
            )
        waiter.future.set_result(error)

    def _unserved(self, waiter: Waiter, now: float, how: QueueExit) -> None:
        """`waiter` leaves its queue unserved: its wait so far is evidence too."""
        if waiter.predicted_s is not None:
            lane, waited_s = waiter.lane.name, now - waiter.enqueued_s
            predicted_s = waiter.predicted_s
            self.predictor.unserved(lane, waiter.protected, predicted_s, waited_s, now, how)

    async def _pump(self) -> None:
        """Dispatch queued requests until nothing more can go, trying them in `_turns`."""
        while True:
            for waiter in self._turns():
                lane, attempt = waiter.lane, waiter.attempt
                queue = self.queues[lane.name]
                spare = self._spare(waiter.protected or waiter.call.resumed)
                refusal = await self._try(attempt, spare, queued=True)
                if refusal is not None:
                    if waiter.protected and refusal.code == Refusal.POOL_CONCURRENCY:
                        self._preempt_for(waiter, queue)
                    if not self._outlasts(refusal, waiter.call, waiter.enqueued_s):
                        continue
                    if queue.remove(waiter) and not waiter.future.done():
                        self.stats[lane.name].unavailable += 1
                        waiter.future.set_result(refusal)
                    break
                since_s = queue.backlogged_since(waiter.flow)
                if not queue.remove(waiter) or waiter.future.done():
                    await self.release(attempt)
                else:
                    now = self.clock.now()
                    wait_s = now - waiter.enqueued_s
                    if waiter.predicted_s is not None:
                        self.predictor.waited(
                            lane.name, waiter.protected, waiter.predicted_s, wait_s, now
                        )
                    self._dispatched(
                        attempt,
                        wait_s,
                        waiter.predicted_s,
                        since_s,
                        protected=waiter.protected,
                        handed_over=waiter.given,
                    )
                    waiter.future.set_result(None)
                break
            else:
                return

    def _turns(self) -> Iterator[Waiter]:
        """Who may take a slot, in order: requests within their share a stream is giving
        its slot to (that slot is theirs); then the rest of answers, oldest first,
        whatever their lane and whether it is paused (their callers are mid-answer,
        and a hand-over must not starve the stream it took a slot from); then each
        lane's head, by priority, its requests within their share first. Worked out
        as the pump goes: each try may wait on the store."""

        def oldest_first(waiters: Iterable[Waiter]) -> list[Waiter]:
            return sorted(waiters, key=lambda waiter: waiter.enqueued_s)

        hands_over = self._hands_over
        if hands_over:
            top = self.queues[self.protected.name]
            yield from oldest_first(w for w in top.protected_waiters() if w.given)
            yield from oldest_first(w for q in self.queues.values() if (w := q.resumed_head()))
        for lane in self._lanes_in_turn():
            if self._paused(lane):
                continue
            queue = self.queues[lane.name]
            self._shed_late(queue)
            waiter = queue.protected_head(self._asked_lately) or queue.head()
            if waiter is not None and not (hands_over and waiter.given):
                yield waiter

    def _preempt_for(self, head: Waiter, queue: LaneQueue) -> None:
        """Free slots for the requests within their share queued in the top lane, whose
        `head` was refused only because every slot is taken: the head first, then the
        others (they stand behind it for the same slots), as long as streams may give
        theirs and at most `RESUMING_PART` of the batch is handed over and not yet
        resumed: each rest takes the next free slot, so more would each wait longer."""
        pending = len(self._asked) + sum(len(other.resumed) for other in self.queues.values())
        for waiter in (head, *queue.protected_waiters()):
            if pending >= self._resuming_at_most:
                return
            if not waiter.preempting:
                if not self._preempt_one(waiter, queue, pending):
                    return
                pending += 1

    def _preempt_one(self, waiter: Waiter, queue: LaneQueue, pending: int) -> bool:
        """Ask one stream of a lower lane, or of another tenant at or beyond its share now
        (a newcomer of it would not come within), to give its slot to `waiter` and
        continue later; False when none may. A stream of a promised lane is asked only
        while its rest, behind the `pending` ones, would resume within that promise
        (`_pause_s`): its answer stands still meanwhile, and the lane waits no longer
        for a token. Lower lanes go first, then the stream with the least to prefill
        again (its prompt and the answer so far): that prefill is the engine time the
        hand-over costs everyone."""
        if not self._resumable:
            return False
        lane, tenant = waiter.lane, waiter.flow
        beyond: dict[str, bool] = {}
        pause_s = self._pause_s(pending)

        def may_yield(running: Attempt) -> bool:
            if not running.lane.queue_size or running.on_preempt is None:
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
                beyond[other] = not queue.fairness.within_share(other, queue.queued, self._batch)
            return beyond[other]

        def cheapest(running: Attempt) -> tuple[int, int]:
            return (running.lane.priority, running.call.prompt_tokens + running.relayed_events)

        candidates = [running for running in self._resumable.values() if may_yield(running)]
        for victim in sorted(candidates, key=cheapest):
            del self._resumable[id(victim)]
            if victim.preempt():
                self._asked[id(victim)] = waiter
                waiter.preempting = waiter.given = True
                self.stats[victim.lane.name].preempted += 1
                return True
        return False

    def _pause_s(self, pending: int) -> Callable[[Attempt], float]:
        """How long a stream would stand still if it gave its slot away now, its rest
        behind `pending` others: until the slots they and it wait on have come free.
        Two readings, and the longer stands. At the rate slots came free lately
        (`turnover`), the expected pause; but ends come in clumps, and a rate read
        just after one promises the next seconds more than they hold (family v2: rests
        stood still up to 4 s under a 2 s bound). So also by the streams holding slots,
        those asked to give theirs aside (their slots are their takers'): each ends at
        the latest when it reaches its `max_tokens` at its pace, and the rest resumes
        at the latest when as many of the others as there are rests have. Any other
        attempt's end only comes sooner. Both readings are this replica's: another
        replica's waiters, or a closed backend gate, may keep a free slot from a
        rest."""
        now = self.clock.now()
        expected_s = (pending + 1) * self.turnover.gap_s(now)
        soonest: list[float] = []

        def pause_s(victim: Attempt) -> float:
            if math.isinf(expected_s):
                return expected_s
            if not soonest:
                asked = self._asked
                ends = (
                    _ends_by_s(running, now)
                    for key, running in self._streaming.items()
                    if key not in asked
                )
                soonest.extend(heapq.nsmallest(pending + 2, ends))
            return max(expected_s, latest_free_s(soonest, pending, _ends_by_s(victim, now)))

        return pause_s

    def _lanes_in_turn(self) -> list[Lane]:
        """Priority order, except that a starving lane (its oldest request waited past the
        lane's `starvation_s`) goes first: strict priority must not starve a lane forever."""
        now = self.clock.now()

        def starving(lane: Lane) -> bool:
            oldest = self.queues[lane.name].oldest_enqueued_s()
            return (
                lane.starvation_s is not None
                and oldest is not None
                and now - oldest > lane.starvation_s
            )

        return sorted(self.lanes, key=lambda lane: not starving(lane))

    def _candidates(self, attempt: Attempt) -> list[Target]:
        """The chain in order, or rotated; deployments that failed this request go last.
        The rest of an answer goes only where a final assistant message is continued
        (one at least: its first part came from such a deployment of this model)."""
        targets = self.targets
        if attempt.call.resumed:
            targets = [target for target in targets if target.deployment.resumable]
        if not self._chain:
            start = next(self._turn) % len(targets)
            targets = targets[start:] + targets[:start]
        avoid = attempt.avoid
        if not avoid:
            return targets
        fresh = [t for t in targets if t.deployment.name not in avoid]
        return fresh or targets

    def _within_share(self, attempt: Attempt) -> bool:
        """Whether `attempt` may take the slots the reserve keeps free: a top-lane request
        that came within its tenant's share of the deployments' batch. Judged once, as
        it comes, as the share is promised: a request sent beyond it does not become
        protected by waiting, nor by coming back (a retry its caller announces, the
        gateway's own next attempt or its hedge was judged when it first came; counted
        again it would take the reserve from the requests within their share while its
        tenant's backoff hides its demand)."""
        lane, call = attempt.lane, attempt.call
        if lane is not self.protected:
            return False
        if call.client_retries or call.resumed or attempt.number > 1 or attempt.hedge:
            return False
        self._note_asked(call)
        queue = self.queues[lane.name]
        return queue.fairness.within_share(call.tenant.name, queue.queued, self._batch)

    def _note_asked(self, call: Call) -> None:
        """Count a top-lane arrival's work, in the engine's unit once it is learnt, as its
        tenant's, within its share or not: the order among the protected requests."""
        rates = self._prefill_rates()
        prefill_rate = sum(rates) / len(rates) if rates else None
        output_tokens = call.reserved_tokens - call.prompt_tokens
        work_s = self.unit.work_s(call.prompt_tokens, output_tokens, prefill_rate)
        if work_s is not None:
            self._recent.asked(call.tenant.name, work_s, call.tenant.weight, self.clock.now())

    def _asked_lately(self, tenant: str) -> float:
        """The engine seconds `tenant` asked lately per its weight (`RecentWork`)."""
        return self._recent.level(tenant, self.clock.now())

    def _busy_above(self, lane: Lane) -> bool:
        """Whether a lane above `lane` had an arrival within `GONE_AFTER_S`, the time
        after which the reserve, too, deems the protected traffic gone."""
        since = self.clock.now() - GONE_AFTER_S
        arrived = self._arrived_s
        return any(
            arrived[other.name] > since for other in self.lanes if other.priority > lane.priority
        )

    def _spare(self, protected: bool) -> int:
        """The slots an attempt must leave free over all the deployments."""
        if protected or not self.reserve.most:
            return 0
        return self.reserve.slots(self.clock.now(), self.predictor.gap_s)

    async def _try(self, attempt: Attempt, spare: int, queued: bool) -> GatewayError | None:
        """Reserve the first candidate deployment that admits the lane and take every
        permit there, leaving `spare` slots of each pool free; None once `attempt` holds
        them, else the refusal to answer. A `queued` attempt stands in the line of the
        last deployment's pools, in the configured order, when they refuse it
        (`PoolGroup.acquire`): one line per replica and model, the same whatever order
        the candidates come in, since a line entry whose replica took a slot elsewhere
        would have a slot set aside for nobody."""
        lane = attempt.lane
        paced = not attempt.call.resumed
        if paced and self._prefilling and self._yielding_for(lane) is not None:
            return Refusal.LANE_YIELDING.error(f"lane {lane.name} yields to first tokens due")
        pace = self._pace_wait_s(lane) if paced else 0.0
        if pace > 0:
            self._retry_after(pace)
            return Refusal.LANE_PACED.error(f"lane {lane.name} is paced", pace)
        refusals: list[GatewayError] = []
        # When a refusal may end: callers are told a later, spread time, but the
        # dispatcher itself looks again at the earliest one.
        wakes: list[float] = []
        for target in self._candidates(attempt):
            checks = self._plan(target, lane)
            verdict = _first_refusal(checks, target, lane, attempt.call.resumed)
            if verdict is not None:
                refusals.append(verdict.error())
                wakes += [] if verdict.wake_in_s is None else [verdict.wake_in_s]
                continue
            self._reserve(attempt, target, checks)
            try:
                tokens, backend = attempt.call.reserved_tokens, target.gate.fleet_slot(lane)
                spare_here = self._spares[spare][target.deployment.name]
                waits = queued and target is self.targets[-1]
                prefill = self._prefill_ask(attempt, target)
                permit = await target.group.acquire(tokens, backend, spare_here, waits, prefill)
            except BaseException:
                self._unreserve(attempt, checks)
                raise
            if isinstance(permit, GatewayError):
                self._unreserve(attempt, checks)
                refusals.append(permit)
                wakes += [] if permit.retry_after_s is None else [permit.retry_after_s]
                continue
            attempt.permit = permit
            return None
        if wakes:
            self._retry_after(min(wakes))
        return _most_telling(refusals)

    def _prefill_ask(self, attempt: Attempt, target: Target) -> Prefill | None:
        """A streamed `attempt`'s part in `target`'s prefill budget: its prompt, to be
        prefilled with those waiting within the budget's part of the promise, or, due by
        then, within what its own promise has left since it arrived if less (the rest
        of an answer has its first token: no promise is left to keep)."""
        call, part_s = attempt.call, self._prefill_within_s
        if part_s is None or not call.stream:
            return None
        key, promise = self._prefill[target.deployment.name].key, attempt.lane.ttft_slo_s
        if promise is not None and not call.resumed:
            left_s = promise - (self.clock.now() - call.arrived_s)
            if left_s < part_s:
                return Prefill(key, call.prompt_tokens, left_s, due=True)
        return Prefill(key, call.prompt_tokens, part_s)

    def _prefilling_at(self, attempt: Attempt) -> _Prefilling | None:
        """The budget `attempt`'s prompt still counts in, if any."""
        target, permit = attempt.target, attempt.permit
        if target is None or permit is None or permit.prefilling is None:
            return None
        return self._prefill[target.deployment.name]

    def _reserve(self, attempt: Attempt, target: Target, checks: tuple[DispatchCheck, ...]) -> None:
        """Record the attempt against what the checks count, and its tenant as holding one
        more, before any await: a request judged while this one waits for the store
        sees it (`_within_share`)."""
        attempt.target = target
        for check in checks:
            check.dispatched(target, attempt.lane)
        self.queues[attempt.lane.name].fairness.in_flight(attempt.call.tenant.name, 1)

    def _unreserve(self, attempt: Attempt, checks: tuple[DispatchCheck, ...]) -> None:
        """Undo `_reserve` for an attempt that did not go out."""
        target = attempt.target
        assert target is not None
        for check in checks:
            check.withdrawn(target, attempt.lane)
        self.queues[attempt.lane.name].fairness.in_flight(attempt.call.tenant.name, -1)
        attempt.target = None

    def _plan(self, target: Target, lane: Lane) -> tuple[DispatchCheck, ...]:
        """The checks `lane` passes on `target`, the same at dispatch and at release:
        chosen once per pair."""
        key = (lane.name, target.deployment.name)
        plan = self._plans.get(key)
        if plan is None:
            plan = tuple(check for check in self.checks if check.applies(target, lane))
            self._plans[key] = plan
        return plan

    def _pace_wait_s(self, lane: Lane) -> float:
        paced = 0.0
        if lane.max_dispatch_rate is not None:
            paced = self._next_dispatch_s.get(lane.name, 0.0) - self.clock.now()
        yielding = self._yielding_for(lane)
        if yielding is not None:
            paced = max(paced, yielding.wait_s())
        return paced

    def _yielding_for(self, lane: Lane) -> Yielding | None:
        """The controller `lane` yields to, if it is below a protected top lane."""
        if lane.priority < self.protected.priority:
            return self.yielding
        return None

    def _dispatched(
        self,
        attempt: Attempt,
        wait_s: float,
        predicted_s: float | None,
        backlogged_since_s: float | None,
        *,
        protected: bool,
        handed_over: bool = False,
    ) -> None:
        """The attempt is the caller's now: charge its tenant and note the dispatch, from
        its tenant's backlog begun at `backlogged_since_s` (None: it did not queue), and
        whether it came `protected` (within its share). One into a slot a stream
        `handed_over` is no service gap: that gap is the time between slots coming free,
        which queued requests wait on, and counting hand-overs would shorten it by their
        rate."""
        call, lane = attempt.call, attempt.lane
        output = call.reserved_tokens - call.prompt_tokens
        attempt.charged_output = output
        fairness = self.queues[lane.name].fairness
        fairness.charge(call.tenant.name, 0 if call.resumed else call.prompt_tokens, output)
        stats = self.stats[lane.name]
        stats.dispatched += 1
        stats.queue_dispatched += backlogged_since_s is not None
        stats.in_flight += 1
        stats.wait_s_total += wait_s
        if self._on_wait is not None:
            self._on_wait(self.model, lane.name, wait_s, predicted_s, protected)
        now = attempt.dispatched_s = self.clock.now()
        prefilling = self._prefilling_at(attempt)
        if prefilling is not None:
            prefilling.pending += call.prompt_tokens
        yielding = self._yielding_for(lane)
        if yielding is not None:
            yielding.dispatched()
        elif self.yielding is not None and lane is self.protected and call.stream:
            self._prefilling.add(id(attempt))
        rate = lane.max_dispatch_rate
        if rate is not None:
            earliest = max(self._next_dispatch_s.get(lane.name, now), now)
            self._next_dispatch_s[lane.name] = earliest + 1.0 / rate
        still_queued = any(queue.size for queue in self.queues.values())
        predictor = self.predictor
        if not handed_over:
            predictor.dispatched(now, backlogged_since_s is not None, still_queued)
        if backlogged_since_s is not None and not call.resumed:
            predictor.flow_dispatched(lane.name, call.tenant.name, now, backlogged_since_s)

    def _retry_after(self, delay_s: float | None) -> None:
        """Wake when a rate limit's next slot or a cooldown's end comes."""
        if delay_s is not None and not math.isinf(delay_s):
            self._retry.in_s(delay_s)


def _prompts_meanwhile(attempt: Attempt, budget: _Prefilling | None) -> int | None:
    """The prompt tokens its deployment prefilled between `attempt`'s first token and
    now: 0 without a budget (nothing counted, nothing to take), None when its first
    token was not counted, so its span cannot be split and teaches nothing."""
    if budget is None:
        return 0
    seen = attempt.prompts_seen
    return None if seen is None else budget.prompts - seen


def _ends_by_s(running: Attempt, now: float) -> float:
    """How long `running` may still take: what is left of its `max_tokens` at the
    slower of its own pace since its first bytes (`relayed_events` counts the events
    after those, each a token at least) and its backend's pace now (a slowdown since
    leaves its own behind). Its own is read only once it has streamed `PACED_S`: its
    first events may come together and read as no time a token. Unknown, so endless,
    with neither."""
    first_s, target = running.first_byte_s, running.target
    if first_s is None or target is None:
        return math.inf
    produced, streamed_s = running.relayed_events, now - first_s
    own_s = streamed_s / max(produced, 1) if streamed_s >= PACED_S else 0.0
    pace_s = max(own_s, target.gate.tpot_s or 0.0)
    if pace_s <= 0.0:
        return math.inf
    left = running.call.reserved_tokens - running.call.prompt_tokens - produced
    return max(0, left) * pace_s


def _first_refusal(
    checks: tuple[DispatchCheck, ...], target: Target, lane: Lane, resumed: bool
) -> NotNow | None:
    """The first check that refuses; the rest of an answer is not held to its lane's
    share (it held its slot within it until it gave it away), though it counts in it."""
    for check in checks:
        if resumed and isinstance(check, ShareCheck):
            continue
        verdict = check.check(target, lane)
        if verdict is not None:
            return verdict
    return None


def _granted(waiter: Waiter) -> bool:
    future = waiter.future
    return future.done() and not future.cancelled() and future.result() is None


def _most_telling(refusals: list[GatewayError]) -> GatewayError:
    """The refusal to answer with: when every deployment named a time, the soonest one;
    otherwise one without a time, since the wait is then unknown."""
    untimed = [r for r in refusals if r.retry_after_s is None]
    if untimed:
        return untimed[0]
    return min(refusals, key=lambda r: r.retry_after_s or 0.0)


class _SpareSplit(dict[int, dict[str, int]]):
    """Each deployment's part of `spare` slots over all of them: in proportion to what it
    takes at once (rounded down, the rest one each from the first), never all of it."""

    def __init__(self, targets: Sequence[Target]) -> None:
        super().__init__()
        self._targets = tuple(targets)

    def __missing__(self, spare: int) -> dict[str, int]:
        batch = sum(target.full for target in self._targets)
        parts = [spare * target.full // batch for target in self._targets]
        for index in range(spare - sum(parts)):
            parts[index % len(parts)] += 1
        split = {
            target.deployment.name: min(part, target.full - 1)
            for target, part in zip(self._targets, parts, strict=True)
        }
        self[spare] = split
        return split
