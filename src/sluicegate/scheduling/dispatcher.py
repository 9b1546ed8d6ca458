"""The per-model dispatcher: who goes now? The one place a request may wait for its turn.

A request that finds nobody queued ahead of it in its lane or above is dispatched at
once if a deployment can take it. Otherwise it joins its lane's queue and waits, within
its deadline and its age limit, while the dispatcher serves lanes in turn and tenants
within a lane in the fairness policy's order. Dispatching takes every pool permit and
token reservation the attempt needs; the attempt owns them until `release`. The
dispatcher wakes on events (arrival, release, a backend sample, a rate limit's next
slot, a timer on its clock), never on a polling tick.

It is an engine: it keeps the queues, pumps them, times waits and asks its plug-ins
(`plugin`). Its checks say whether a lane may go to a target now and undo exactly what
they counted; its observers hear every arrival, dispatch, first token and end. Every
check and the count it guards happen in one synchronous step, before the first await
(the pool permits): a limit store that yields cannot let two attempts pass a check that
only one of them fits.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from sluicegate.core.clock import Clock, Wakeup
from sluicegate.core.errors import GatewayError
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.checks import default_checks
from sluicegate.scheduling.demand import Learner
from sluicegate.scheduling.fairness import FairnessPolicy, WeighsSlots
from sluicegate.scheduling.handover import Giver, HandOver, Rests
from sluicegate.scheduling.pacing import Pacing
from sluicegate.scheduling.plugin import Check, Dispatch, NotNow, Observer, hearing
from sluicegate.scheduling.prefilling import PrefillBudgets
from sluicegate.scheduling.promise import QueueExit
from sluicegate.scheduling.queueing import QueueRule
from sluicegate.scheduling.queues import LaneQueue, Waiter
from sluicegate.scheduling.reserve import GONE_AFTER_S, MOST_OF_BATCH, SpareSlots
from sluicegate.scheduling.routing import Routing
from sluicegate.scheduling.share import WithinShare
from sluicegate.scheduling.slotcost import SlotCosts
from sluicegate.scheduling.stats import Exit, OnWait, Stats
from sluicegate.scheduling.turns import Turns
from sluicegate.scheduling.views import DispatcherView, LaneView, TargetView

Holder = LaneQueue | Rests
"""What a waiter waits in."""


class Plan(NamedTuple):
    """The checks a lane passes on a target: chosen once per pair."""

    target: tuple[Check, ...]
    """Asked of each candidate target (the lane-wide ones are asked once per try)."""
    every: tuple[Check, ...]
    """Lane-wide and target checks alike: what counts the attempt, and undoes it."""


class Dispatcher:
    def __init__(
        self,
        model: str,
        lanes: Sequence[Lane],
        targets: Sequence[Target],
        fairness: Callable[[Lane], FairnessPolicy],
        clock: Clock,
        on_wait: OnWait | None = None,
        paused: Callable[[Lane], bool] = lambda lane: False,
        chain: bool = False,
        reserve: float = MOST_OF_BATCH,
    ) -> None:
        self.model = model
        self.lanes = sorted(lanes, key=lambda lane: -lane.priority)
        self.top = self.lanes[0]
        self.targets = list(targets)
        self.clock = clock
        self.queues = {lane.name: LaneQueue(lane, fairness(lane)) for lane in self.lanes}
        self._slot_costs = {
            name: queue.fairness.costs
            for name, queue in self.queues.items()
            if isinstance(queue.fairness, WeighsSlots)
        }
        self._paused = paused
        self.routing = Routing(self.targets, chain)
        self._plans: dict[tuple[str, str], Plan] = {}
        self._kicked = asyncio.Event()
        self._retry = Wakeup(clock, self.kick)
        """The wake-up for a rate limit's next slot or a cooldown's end."""
        batch = sum(target.full for target in self.targets)
        top_queue = self.queues[self.top.name]
        self.stats = Stats(model, self.lanes, on_wait)
        self.budgets = PrefillBudgets(self.lanes, self.targets, clock)
        self.rule = QueueRule(self.lanes, batch, clock, self.budgets.rates)
        self.spares = SpareSlots(self.targets, reserve, clock, self._gap_s)
        self.learner = Learner(
            len(self.targets),
            clock,
            self.stats.in_flight,
            self.budgets.rate,
            self.budgets.prompts_meanwhile,
            self._costs,
        )
        resumable = any(target.deployment.resumable for target in self.targets)
        self.handover = HandOver(batch, clock, self.queues) if resumable else None
        """Built only where a stream may give its slot away: elsewhere the pump's order is
        the lanes' alone, and no request is the rest of an answer."""
        queued = top_queue.queued if self.handover is None else self.handover.queued(top_queue)
        unit = self.learner.unit
        self.share = WithinShare(
            self.top, top_queue.fairness, queued, batch, clock, unit.work_s, self.budgets.rates
        )
        self.turns = Turns(self.lanes, self.queues, self._queued, clock, self.share.asked_lately)
        self.pacing = Pacing(self.lanes, clock, self.kick)
        self.checks: tuple[Check, ...] = (
            self.pacing,
            *default_checks(self.lanes, clock, GONE_AFTER_S),
        )
        first = self.targets[:1]
        self._lane_wide = {
            lane.name: tuple(
                c for c in self.checks for t in first if c.lane_wide and c.applies(t, lane)
            )
            for lane in self.lanes
        }
        """Per lane, the checks asked once per try, whatever the target (they read none)."""
        learners = (self.handover, self.pacing, self.learner, self.budgets, self.stats)
        plugins = (*self.checks, self.spares, self.rule, *learners)
        self.observers: tuple[Observer, ...] = tuple(
            dict.fromkeys(p for p in plugins if isinstance(p, Observer))
        )
        """In the order they hear an end: the learner reads the requests in flight and
        the prompts prefilled during the answer before the stats and the budgets count
        this one out."""
        self._arrived = hearing(self.observers, "arrived")
        self._on_dispatch = hearing(self.observers, "dispatched")
        self._first_token = hearing(self.observers, "first_token")
        self._ended_by = hearing(self.observers, "ended")
        for target in self.targets:
            target.gate.on_change(self.kick)
            for pool in target.pools:
                pool.on_release(self.kick)

    def kick(self) -> None:
        self._kicked.set()

    async def run(self) -> None:
        while True:
            await self._kicked.wait()
            self._kicked.clear()
            await self._pump()

    async def acquire(self, attempt: Attempt) -> None:
        """Grant `attempt` a deployment and its permits, at once or after a wait in its
        lane's queue; raise the refusal otherwise. Once this returns, the attempt is
        the caller's to `release`. Every refusal of a request judged within its share,
        at once or after its wait, is counted here."""
        within_share = self.share.judge(attempt)
        for arrived in self._arrived:
            arrived(attempt, within_share)
        try:
            await self._admit(attempt, within_share)
        except GatewayError as refusal:
            if within_share:
                self.stats.protected_refused[refusal.code] += 1
            raise

    async def _admit(self, attempt: Attempt, within_share: bool) -> None:
        call, lane = attempt.call, attempt.lane
        queue = self.queues[lane.name]
        ahead = queue.within_share if within_share else self.turns.queued_ahead(lane)
        if not ahead and not self._paused(lane):
            refusal = await self._try(attempt, self.spares.spare(within_share), queued=False)
            if refusal is None:
                self._dispatched(attempt, 0.0, None, None, within_share)
                return
        else:
            refusal = Refusal.LANE_BACKLOGGED.error(
                f"lane {lane.name} has requests waiting ahead of it"
            )
        if lane.queue_size == 0 or self.rule.outlasts(refusal, call, self.clock.now()):
            raise refusal
        predicted_s = None
        if not call.resumed:
            predicted_s = self.rule.promise(
                call, self.turns.place(call, within_share), within_share
            )
        if self._queued(lane.name) >= lane.queue_size and not call.resumed:
            raise Refusal.QUEUE_FULL.error(f"the {lane.name} queue of {self.model} is full")
        waiter = Waiter(attempt, self.clock.now(), predicted_s, within_share)
        holder = self._holder(waiter)
        holder.push(waiter)
        self.kick()
        await self._wait(waiter, holder)

    def first_token(self, attempt: Attempt, ttft_s: float) -> None:
        """A streamed request got its first token `ttft_s` after arrival."""
        for heard in self._first_token:
            heard(attempt, ttft_s)

    def may_give(self, attempt: Attempt, giver: Giver) -> None:
        """`attempt`'s stream may give its slot away, through `giver`."""
        if self.handover is not None:
            self.handover.may_give(attempt, giver)

    async def release(self, attempt: Attempt) -> None:
        """End an attempt: undo what dispatching it recorded, tell the observers of an
        attempt that went out, and free its permits (settling tokens against its usage)."""
        target = attempt.target
        if target is None:
            return
        if attempt.dispatched_s is None:
            self._untake(attempt, self._plan(target, attempt.lane).every)
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
        lane = attempt.lane
        for check in self._plan(target, lane).every:
            check.released(target, lane, attempt)
        for ended in self._ended_by:
            ended(attempt)
        fairness, tenant = self.queues[lane.name].fairness, attempt.call.tenant.name
        fairness.in_flight(tenant, -1)
        produced = attempt.produced()
        if produced is not None:
            fairness.charge(tenant, 0, produced - attempt.charged_output)

    async def _wait(self, waiter: Waiter, queue: Holder) -> None:
        """The intentional wait point: bounded by the request's age limit, as known when
        it queued (a prefill rate learnt later does not move it), and the deadline, both
        timed on the dispatcher's clock."""
        call = waiter.call
        waited_s = self.rule.age_limit_s(call)
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
                self.stats.left(waiter.lane, Exit.ABANDONED)
            if _granted(waiter):
                await self.release(waiter.attempt)
            raise
        finally:
            timer.cancel()
        if refusal is not None:
            raise refusal.renewed()

    def _expire(self, waiter: Waiter, queue: Holder, waited_s: float | None) -> None:
        """Answer a request still queued when its deadline (`waited_s` None) or its age
        limit came."""
        error, how = self.rule.expired(waiter.lane, waited_s)
        self._refuse(waiter, queue, error, Exit.EXPIRED, how)

    def _refuse(
        self,
        waiter: Waiter,
        queue: Holder,
        error: GatewayError,
        exited: Exit,
        learnt: QueueExit | None,
    ) -> None:
        """Answer a queued request with `error`, if it is still queued; its wait so far
        teaches the predictor when it left as `learnt`."""
        if not queue.remove(waiter) or waiter.future.done():
            return
        if learnt is not None:
            self.rule.unserved(waiter, learnt)
        self.stats.left(waiter.lane, exited)
        waiter.future.set_result(error)

    async def _pump(self) -> None:
        """Dispatch queued requests until nothing more can go, trying them in `_turns`."""
        while True:
            for waiter in self._turns():
                lane, attempt = waiter.lane, waiter.attempt
                queue, holder = self.queues[lane.name], self._holder(waiter)
                spare = self.spares.spare(waiter.within_share or waiter.call.resumed)
                refusal = await self._try(attempt, spare, queued=True)
                handover = self.handover
                if refusal is not None:
                    slots_full = refusal.code == Refusal.POOL_CONCURRENCY
                    if handover is not None and waiter.within_share and slots_full:
                        handover.preempt_for(waiter, queue)
                    if not self.rule.outlasts(refusal, waiter.call, waiter.enqueued_s):
                        continue
                    self._refuse(waiter, holder, refusal, Exit.UNAVAILABLE, None)
                    break
                since_s = queue.backlogged_since(waiter.flow)
                if not holder.remove(waiter) or waiter.future.done():
                    await self.release(attempt)
                else:
                    wait_s = self.clock.now() - waiter.enqueued_s
                    given = handover is not None and handover.gave(waiter)
                    predicted_s = waiter.predicted_s
                    self._dispatched(
                        attempt, wait_s, predicted_s, since_s, waiter.within_share, given
                    )
                    waiter.future.set_result(None)
                break
            else:
                return

    def _turns(self) -> Iterator[Waiter]:
        """Who may take a slot, in order: those a hand-over puts first, then each lane's
        head in turn, its requests within their share first, after its late requests are
        shed. Worked out as the pump goes: each try may wait on the store."""
        handover = self.handover
        if handover is not None:
            yield from handover.first_turns(self.queues[self.top.name])
        for lane in self.turns.lanes():
            if self._paused(lane):
                continue
            queue = self.queues[lane.name]
            for late, error in list(self.rule.late(queue)):
                self._refuse(late, queue, error, Exit.SHED, QueueExit.DROPPED)
            waiter = queue.within_share_head(self.share.asked_lately) or queue.head()
            if waiter is not None and not (handover is not None and handover.gave(waiter)):
                yield waiter

    async def _try(self, attempt: Attempt, spare: int, queued: bool) -> GatewayError | None:
        """Take the first candidate deployment that admits the lane and every permit
        there, leaving `spare` slots free over all of them; None once `attempt` holds
        them, else the refusal to answer. A `queued` attempt stands in the line of the
        last deployment's pools, in the configured order, when they refuse it
        (`PoolGroup.acquire`): one line per replica and model, the same whatever order
        the candidates come in, since a line entry whose replica took a slot elsewhere
        would have a slot set aside for nobody."""
        lane, rest = attempt.lane, attempt.call.resumed
        lane_wide = self._lane_wide[lane.name]
        if lane_wide:
            verdict = _first_refusal(lane_wide, self.targets[0], lane, rest)
            if verdict is not None:
                self._retry_after(verdict.wake_in_s)
                return verdict.error()
        refusals: list[GatewayError] = []
        # When a refusal may end: callers are told a later, spread time, but the
        # dispatcher itself looks again at the earliest one.
        wakes: list[float] = []
        for target in self.routing.candidates(attempt):
            plan = self._plan(target, lane)
            verdict = _first_refusal(plan.target, target, lane, rest)
            if verdict is not None:
                refusals.append(verdict.error())
                wakes += [] if verdict.wake_in_s is None else [verdict.wake_in_s]
                continue
            self._take(attempt, target, plan.every)
            try:
                tokens, backend = attempt.call.reserved_tokens, target.gate.fleet_slot(lane)
                spare_here = self.spares.at(spare, target) if spare else 0
                waits = queued and target is self.targets[-1]
                prefill = self.budgets.ask(attempt, target)
                permit = await target.group.acquire(tokens, backend, spare_here, waits, prefill)
            except BaseException:
                self._untake(attempt, plan.every)
                raise
            if isinstance(permit, GatewayError):
                self._untake(attempt, plan.every)
                refusals.append(permit)
                wakes += [] if permit.retry_after_s is None else [permit.retry_after_s]
                continue
            attempt.permit = permit
            return None
        if wakes:
            self._retry_after(min(wakes))
        return _most_telling(refusals)

    def _take(self, attempt: Attempt, target: Target, checks: tuple[Check, ...]) -> None:
        """Record the attempt against what the checks count, and its tenant as holding one
        more, before any await: a request judged while this one waits for the store
        sees it (`WithinShare`)."""
        attempt.target = target
        lane = attempt.lane
        for check in checks:
            check.taken(target, lane)
        self.queues[lane.name].fairness.in_flight(attempt.call.tenant.name, 1)

    def _untake(self, attempt: Attempt, checks: tuple[Check, ...]) -> None:
        """Undo `_take` for an attempt that did not go out."""
        target, lane = attempt.target, attempt.lane
        assert target is not None
        for check in checks:
            check.withdrawn(target, lane)
        self.queues[lane.name].fairness.in_flight(attempt.call.tenant.name, -1)
        attempt.target = None

    def _plan(self, target: Target, lane: Lane) -> Plan:
        """The checks `lane` passes on `target`, the same at dispatch and at release:
        chosen once per pair."""
        key = (lane.name, target.deployment.name)
        plan = self._plans.get(key)
        if plan is None:
            lane_wide = self._lane_wide[lane.name]
            own = tuple(c for c in self.checks if not c.lane_wide and c.applies(target, lane))
            plan = self._plans[key] = Plan(own, lane_wide + own)
        return plan

    def _dispatched(
        self,
        attempt: Attempt,
        wait_s: float,
        predicted_s: float | None,
        backlogged_since_s: float | None,
        within_share: bool,
        handed_over: bool = False,
    ) -> None:
        """The attempt is the caller's now: charge its tenant the work it asked and tell
        the observers."""
        call = attempt.call
        attempt.dispatched_s = self.clock.now()
        output = call.reserved_tokens - call.prompt_tokens
        attempt.charged_output = output
        prompt = 0 if call.resumed else call.prompt_tokens
        self.queues[attempt.lane.name].fairness.charge(call.tenant.name, prompt, output)
        queued = any(queue.size for queue in self.queues.values()) or bool(
            self.handover and self.handover.rests.count
        )
        how = Dispatch(wait_s, predicted_s, backlogged_since_s, within_share, handed_over, queued)
        for dispatched in self._on_dispatch:
            dispatched(attempt, how)

    def _queued(self, lane: str) -> int:
        """The requests waiting in `lane`, the rest of answers included."""
        queued = self.queues[lane].size
        return queued if self.handover is None else queued + self.handover.rests.size(lane)

    def _holder(self, waiter: Waiter) -> Holder:
        """Where `waiter` waits: the rest of an answer apart, outside the fair order."""
        if self.handover is not None and waiter.call.resumed:
            return self.handover.rests
        return self.queues[waiter.lane.name]

    def _costs(self, lane: Lane) -> SlotCosts | None:
        """What a slot of each tenant costs in `lane`, where its fair order weighs them."""
        return self._slot_costs.get(lane.name)

    def _gap_s(self) -> float | None:
        return self.rule.predictor.gap_s

    def _retry_after(self, delay_s: float | None) -> None:
        """Wake when a rate limit's next slot or a cooldown's end comes."""
        if delay_s is not None and not math.isinf(delay_s):
            self._retry.in_s(delay_s)

    def view(self) -> DispatcherView:
        lanes = tuple(self.lane_view(lane.name) for lane in self.lanes)
        targets = tuple(self._target_view(target) for target in self.targets)
        pacing = self.pacing.view()
        reserved, arrivals = self.spares.view()
        unit = self.learner.unit
        return DispatcherView(
            self.model,
            lanes,
            targets,
            self._gap_s(),
            pacing["yields"],
            pacing.get("rate_per_s"),
            pacing.get("cuts", 0),
            {check.name: check.view() for check in self.checks if check is not self.pacing},
            reserved,
            arrivals,
            dict(self.stats.protected_refused),
            unit.decode_s_per_token,
            unit.prefill_s_per_token,
        )

    def lane_view(self, name: str) -> LaneView:
        now = self.clock.now()
        queue, stats = self.queues[name], self.stats.lanes[name]
        lane = queue.lane
        oldest = queue.oldest_enqueued_s()
        forecast = self.rule.forecast(lane.name)
        costs = self._costs(lane)
        exits = stats.exits
        return LaneView(
            name=lane.name,
            queued=self._queued(name),
            oldest_age_s=0.0 if oldest is None else now - oldest,
            in_flight=stats.in_flight,
            dispatched=stats.dispatched,
            queue_dispatched=stats.queue_dispatched,
            expired=exits[Exit.EXPIRED],
            service=queue.fairness.service(),
            slot_costs={} if costs is None else costs.view(),
            shed=exits[Exit.SHED],
            unavailable=exits[Exit.UNAVAILABLE],
            abandoned=exits[Exit.ABANDONED],
            preempted=0 if self.handover is None else self.handover.preempted[lane.name],
            wait_correction=forecast.correction(within_share=False),
            wait_correction_within_share=forecast.correction(within_share=True),
            wait_tail=forecast.tail(now),
            after_dispatch_s=forecast.after_dispatch_s,
        )

    def _target_view(self, target: Target) -> TargetView:
        budget = self.budgets.view(target)
        return TargetView(
            target.deployment.name,
            target.breaker.view(),
            target.gate.state(),
            None if budget is None else budget.pending_tokens,
            None if budget is None else budget.tokens_per_s,
        )


def _first_refusal(
    checks: tuple[Check, ...], target: Target, lane: Lane, rest: bool
) -> NotNow | None:
    """The first check that refuses; the rest of an answer passes those that do not hold
    rests, though it counts in them."""
    for check in checks:
        if rest and not check.holds_rests:
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
