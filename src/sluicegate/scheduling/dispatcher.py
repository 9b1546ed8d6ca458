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

from sluicegate.core.clock import Clock, Wakeup
from sluicegate.core.errors import GatewayError
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane, Mechanism
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.checks import default_checks
from sluicegate.scheduling.demand import Learner
from sluicegate.scheduling.fairness import Fairness
from sluicegate.scheduling.handover import Giver, HandOver, Rests
from sluicegate.scheduling.pacing import Pacing
from sluicegate.scheduling.placement import Placement
from sluicegate.scheduling.placement.round_robin import RoundRobin
from sluicegate.scheduling.plugin import Check, Dispatch, Observer, Plans, first_refusal, hearing
from sluicegate.scheduling.prefilling import PrefillBudgets
from sluicegate.scheduling.promise import QueueExit
from sluicegate.scheduling.queueing import QueueRule
from sluicegate.scheduling.queues import LaneQueue, Waiter
from sluicegate.scheduling.reserve import GONE_AFTER_S, MOST_OF_BATCH, SpareSlots
from sluicegate.scheduling.routing import Routing, most_telling
from sluicegate.scheduling.share import WithinShare
from sluicegate.scheduling.stats import Exit, OnWait, Stats
from sluicegate.scheduling.tenants import Tenants
from sluicegate.scheduling.turns import Turns
from sluicegate.scheduling.views import DispatcherView, LaneView, dispatcher_view, lane_view

Holder = LaneQueue | Rests
"""What a waiter waits in."""


class Dispatcher:
    def __init__(
        self,
        model: str,
        lanes: Sequence[Lane],
        targets: Sequence[Target],
        fairness: Callable[[Lane], Fairness],
        clock: Clock,
        on_wait: OnWait | None = None,
        paused: Callable[[Lane], bool] = lambda lane: False,
        placement: Placement | None = None,
        reserve: float = MOST_OF_BATCH,
        disabled: frozenset[Mechanism] = frozenset(),
    ) -> None:
        self.model = model
        self.lanes = sorted(lanes, key=lambda lane: -lane.priority)
        self.top = top = self.lanes[0]
        self.targets = list(targets)
        self.clock = clock
        fair = {lane.name: fairness(lane) for lane in self.lanes}
        self.queues = {lane.name: LaneQueue(lane, fair[lane.name]) for lane in self.lanes}
        self._paused = paused
        self.routing = Routing(self.targets, placement or RoundRobin())
        self._kicked = asyncio.Event()
        self._retry = Wakeup(clock, self.kick)
        """The wake-up for a rate limit's next slot or a cooldown's end."""
        batch = sum(target.full for target in self.targets)
        self.stats = Stats(model, self.lanes, on_wait)
        budgeted = Mechanism.PREFILL_BUDGET not in disabled
        self.budgets = budgets = PrefillBudgets(self.lanes, self.targets, clock, budgeted)
        predicts = Mechanism.PREDICTOR not in disabled
        self.rule = QueueRule(self.lanes, batch, clock, budgets.rates, predicts)
        judges = Mechanism.WITHIN_SHARE not in disabled
        reserve = reserve if judges and top.ttft_slo_s is not None else 0.0
        self.spares = SpareSlots(self.targets, reserve, clock, lambda: self.rule.predictor.gap_s)
        self.learner = Learner(
            len(self.targets),
            clock,
            self.stats.in_flight,
            budgets.rate,
            budgets.prompts_meanwhile,
            budgets.listening,
        )
        resumable = any(target.deployment.resumable for target in self.targets)
        hands_over = resumable and judges and Mechanism.HANDOVER not in disabled
        self.handover = (
            HandOver(batch, clock, self.queues, fair[top.name], Mechanism.TURNOVER not in disabled)
            if hands_over
            else None
        )
        """Built only where a stream may give its slot away: elsewhere the pump's order is
        the lanes' alone, and no request is the rest of an answer."""
        top_queue = self.queues[top.name]
        queued = top_queue.queued if self.handover is None else self.handover.queued(top_queue)
        work_s = self.learner.unit.work_s
        self.share = WithinShare(
            top, fair[top.name], queued, batch, clock, work_s, budgets.rates, judges
        )
        self.turns = Turns(self.lanes, self.queues, self.queued, clock, self.share.asked_lately)
        self.pacing = Pacing(self.lanes, clock)
        tenants = Tenants(fair)
        self.checks: tuple[Check, ...] = (
            self.pacing,
            *default_checks(self.lanes, clock, GONE_AFTER_S),
            tenants,
        )
        self._plans = Plans(self.checks, self.lanes, self.targets)
        learners = (self.handover, self.pacing, self.learner, budgets, self.stats, self.routing)
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
        """Have the pump look again, when someone waits for it: a release, a gate or a
        pool's change with every queue empty gives it nothing to do, and each wake-up
        costs a turn of the loop on the path of the request that caused it."""
        if self._waiting():
            self._kicked.set()

    def _waiting(self) -> bool:
        return any(queue.size for queue in self.queues.values()) or bool(
            self.handover and self.handover.rests.count
        )

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
        if self.queued(lane.name) >= lane.queue_size and not call.resumed:
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
        lane = attempt.lane
        if attempt.dispatched_s is None:
            self._untake(attempt, self._plans.of(target, lane).every)
        else:
            for check in self._plans.of(target, lane).every:
                check.released(target, lane, attempt)
            for ended in self._ended_by:
                ended(attempt)
        attempt.target = None
        permit, attempt.permit = attempt.permit, None
        try:
            if permit is not None:
                await permit.release(attempt.used_tokens)
        finally:
            self.kick()

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
        lane_wide = self._plans.lane_wide[lane.name]
        if lane_wide:
            verdict = first_refusal(lane_wide, self.targets[0], lane, rest)
            if verdict is not None:
                self._retry_after(verdict.wake_in_s)
                return verdict.error()
        refusals: list[GatewayError] = []
        # When a refusal may end: callers are told a later, spread time, but the
        # dispatcher itself looks again at the earliest one.
        wakes: list[float] = []
        for target in self.routing.candidates(attempt):
            plan = self._plans.of(target, lane)
            verdict = first_refusal(plan.target, target, lane, rest)
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
        return most_telling(refusals)

    def _take(self, attempt: Attempt, target: Target, checks: tuple[Check, ...]) -> None:
        """Record the attempt against what the checks count, before any await."""
        attempt.target = target
        for check in checks:
            check.taken(target, attempt.lane, attempt)

    def _untake(self, attempt: Attempt, checks: tuple[Check, ...]) -> None:
        """Undo `_take` for an attempt that did not go out."""
        target = attempt.target
        assert target is not None
        for check in checks:
            check.withdrawn(target, attempt.lane, attempt)
        attempt.target = None

    def _dispatched(
        self,
        attempt: Attempt,
        wait_s: float,
        predicted_s: float | None,
        backlogged_since_s: float | None,
        within_share: bool,
        handed_over: bool = False,
    ) -> None:
        """The attempt is the caller's now: tell the observers."""
        attempt.dispatched_s = self.clock.now()
        queued = self._waiting()
        how = Dispatch(wait_s, predicted_s, backlogged_since_s, within_share, handed_over, queued)
        for dispatched in self._on_dispatch:
            dispatched(attempt, how)

    def queued(self, lane: str) -> int:
        """The requests waiting in `lane`, the rest of answers included."""
        queued = self.queues[lane].size
        return queued if self.handover is None else queued + self.handover.rests.size(lane)

    def _holder(self, waiter: Waiter) -> Holder:
        """Where `waiter` waits: the rest of an answer apart, outside the fair order."""
        if self.handover is not None and waiter.call.resumed:
            return self.handover.rests
        return self.queues[waiter.lane.name]

    def _retry_after(self, delay_s: float | None) -> None:
        """Wake when a rate limit's next slot or a cooldown's end comes."""
        if delay_s is not None and not math.isinf(delay_s):
            self._retry.in_s(delay_s)

    def view(self) -> DispatcherView:
        return dispatcher_view(self)

    def lane_view(self, name: str) -> LaneView:
        return lane_view(self, name)


def _granted(waiter: Waiter) -> bool:
    future = waiter.future
    return future.done() and not future.cancelled() and future.result() is None
