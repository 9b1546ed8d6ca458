"""The wait predictor, its correction and the lanes' shedding, on a fake clock."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from sluicegate.capacity.pools import Pool, PoolPermit
from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Lane, PoolSpec
from sluicegate.scheduling.attempt import Attempt
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.fairness import RoundRobin, VirtualTokenCounter
from sluicegate.scheduling.promise import (
    CORRECTION_SMOOTHING,
    MAX_CORRECTION,
    TAIL_QUANTILE,
    TAIL_QUIET_S,
    TAIL_STEP,
    QueueExit,
    Shedder,
    WaitPredictor,
)
from sluicegate.scheduling.queues import LaneQueue, Place, Waiter
from tests.support.clock import FakeClock
from tests.unit.scheduling.test_dispatcher import (
    attempt,
    dispatcher_for,
    granted,
    leases,
    reserving,
    settle,
)

PROMISED = Lane("promised", queue_size=100, max_queue_age_s=10, ttft_slo_s=2.0)


def test_the_service_gap_counts_only_gaps_across_which_work_waited():
    predictor = WaitPredictor()
    predictor.dispatched(0.0, from_queue=False, still_queued=False)
    predictor.dispatched(10.0, from_queue=True, still_queued=True)
    assert predictor.gap_s is None, "ten idle seconds are no measure of the backend"
    predictor.dispatched(10.5, from_queue=True, still_queued=True)
    assert predictor.gap_s == pytest.approx(0.5)
    predictor.dispatched(11.0, from_queue=True, still_queued=False)
    predictor.dispatched(30.0, from_queue=False, still_queued=False)
    assert predictor.gap_s == pytest.approx(0.5)


def test_a_stalled_backend_lengthens_predictions_at_once():
    predictor = WaitPredictor()
    for now in (0.0, 0.5, 1.0):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    assert predictor.wait_s("l", "t", 3, 0, 1.0) == pytest.approx(4 * 0.5)
    assert predictor.wait_s("l", "t", 3, 0, 4.0) == pytest.approx(4 * 3.0)


def test_predictions_that_were_too_short_are_corrected_and_the_correction_is_bounded():
    """Each request is admitted on the corrected prediction and compared with it."""
    predictor = WaitPredictor()
    for now in (0.0, 1.0):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    for _ in range(200):
        predictor.waited("l", False, predictor.wait_s("l", "t", 0, 0, 1.0), 2.0, 1.0)
    assert predictor.lane("l").correction(within_share=False) == pytest.approx(2.0, rel=0.01)
    for _ in range(200):
        predictor.waited("l", False, predictor.wait_s("l", "t", 0, 0, 1.0), 1000.0, 1.0)
    assert predictor.lane("l").correction(within_share=False) == pytest.approx(MAX_CORRECTION)


def test_a_correction_follows_the_backend_back_when_it_speeds_up():
    """The ratio is of real waits to corrected predictions: once the backend is fast
    again, real waits fall below them and the correction comes back down."""
    predictor = WaitPredictor()
    for now in (0.0, 1.0):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    for _ in range(100):
        predictor.waited("l", False, predictor.wait_s("l", "t", 0, 0, 1.0), 3.0, 1.0)
    assert predictor.wait_s("l", "t", 0, 0, 1.0) == pytest.approx(3.0, rel=0.05)
    for _ in range(100):
        predictor.waited("l", False, predictor.wait_s("l", "t", 0, 0, 1.0), 1.0, 1.0)
    assert predictor.wait_s("l", "t", 0, 0, 1.0) == pytest.approx(1.0, rel=0.05)


def test_requests_that_leave_unserved_after_outlasting_their_prediction_correct_it():
    """Every request expires after 1.5 s on a 0.5 s prediction: none is ever dispatched,
    yet the predictor learns it was short. One that left before its predicted wait
    (a caller that gave up) says nothing."""
    predictor = WaitPredictor()
    for now in (0.0, 0.5):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    for _ in range(5):
        predictor.unserved("l", False, predictor.wait_s("l", "t", 0, 0, 0.5), 0.4, 0.5, DROPPED)
    assert predictor.lane("l").correction(within_share=False) == 1.0
    for _ in range(200):
        predictor.unserved("l", False, predictor.wait_s("l", "t", 0, 0, 0.5), 1.5, 0.5, DROPPED)
    assert predictor.wait_s("l", "t", 0, 0, 0.5) == pytest.approx(1.5, rel=0.05)


def test_waits_within_and_beyond_share_are_corrected_apart():
    """On a 0.5 s gap, requests within their share take the reserve in 0.25 s while those
    beyond it wait 2 s: one ratio for both would fit neither."""
    predictor = WaitPredictor()
    for now in (0.0, 0.5):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    for _ in range(200):
        beyond = predictor.wait_s("l", "t", 0, 0, 0.5, within_share=False)
        predictor.waited("l", False, beyond, 2.0, 0.5)
        within = predictor.wait_s("l", "t", 0, 0, 0.5, within_share=True)
        predictor.waited("l", True, within, 0.25, 0.5)
    assert predictor.wait_s("l", "t", 0, 0, 0.5, within_share=False) == pytest.approx(2.0, rel=0.05)
    assert predictor.wait_s("l", "t", 0, 0, 0.5, within_share=True) == pytest.approx(0.25, rel=0.05)


DROPPED, DEADLINE = QueueExit.DROPPED, QueueExit.DEADLINE


def tail(predictor: WaitPredictor, now: float = 1.0) -> float:
    return predictor.admitted_wait_s("l", 1.0, False, now)


def test_a_queue_is_admitted_to_by_the_90th_percentile_of_its_waits():
    """Waits scattered log-normally around a 1 s prediction (sigma 0.7: their 90th
    percentile is 2.45x the median), two queued requests served a second: the correction
    centres the prediction on the median, the tail settles at the 90th percentile of
    real over corrected waits, and about one wait in ten then runs beyond it."""
    predictor = WaitPredictor()
    for now in (0.0, 1.0):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    draw = random.Random(7)
    beyond = 0
    for i in range(6000):
        now = 1.0 + 0.5 * i
        predicted = predictor.wait_s("l", "t", 0, 0, 1.0)
        real = draw.lognormvariate(0.0, 0.7)
        if i >= 3000:
            beyond += real > predicted * tail(predictor, now)
        predictor.waited("l", False, predicted, real, now)
    assert predictor.lane("l").correction(within_share=False) == pytest.approx(1.0, abs=0.15)
    assert 2.0 <= tail(predictor, now) <= 3.0
    assert 0.07 <= beyond / 3000 <= 0.13


def test_unserved_requests_lift_the_tail_and_requests_served_in_time_bring_it_down():
    """Three requests beyond their share expire after 3x their prediction and one is
    shed before its predicted wait: their queue dropped them, queueing them served
    nobody, so each lifts the tail a step. Requests within their share do not teach it.
    Served on time, the tail comes back down to the prediction itself, never below: the
    centre is the correction's to move."""
    predictor = WaitPredictor()
    for now in (0.0, 1.0):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    for waited_s in (3.0, 3.0, 3.0, 0.2):
        for within in (False, True):
            predicted = predictor.wait_s("l", "t", 0, 0, 1.0, within_share=within)
            predictor.unserved("l", within, predicted, waited_s, 1.0, DROPPED)
    assert tail(predictor) == pytest.approx(math.exp(4 * TAIL_STEP * TAIL_QUANTILE))
    for _ in range(200):
        predicted = predictor.wait_s("l", "t", 0, 0, 1.0)
        predictor.waited("l", False, predicted, predicted * 0.1, 1.0)
    assert tail(predictor) == 1.0


def test_a_caller_whose_deadline_passed_lifts_the_tail_only_if_it_waited_beyond_it():
    """The deadline was the caller's, not the queue's: one that passed before the wait
    ran beyond the tail says nothing of it; one that passed later shows the tail short."""
    predictor = WaitPredictor()
    for now in (0.0, 1.0):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    predictor.unserved("l", False, predictor.wait_s("l", "t", 0, 0, 1.0), 0.5, 1.0, DEADLINE)
    assert tail(predictor) == 1.0
    predictor.unserved("l", False, predictor.wait_s("l", "t", 0, 0, 1.0), 3.0, 1.0, DEADLINE)
    assert tail(predictor) == pytest.approx(math.exp(TAIL_STEP * TAIL_QUANTILE))


def test_a_tail_nothing_brings_down_is_forgotten_after_a_silence():
    """Lifted to its bound by requests left unserved, then no queued request for a
    while (a lifted tail admits few): for `TAIL_QUIET_S` the tail holds, then its log
    halves every `TAIL_QUIET_S`, so an overload long over does not keep refusing what a
    short queue could serve. The next wait learns from what is left."""
    predictor = WaitPredictor()
    for now in (0.0, 1.0):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    for _ in range(20):
        predictor.unserved("l", False, predictor.wait_s("l", "t", 0, 0, 1.0), 3.0, 1.0, DROPPED)
    assert tail(predictor) == pytest.approx(MAX_CORRECTION)
    assert tail(predictor, 1.0 + TAIL_QUIET_S) == pytest.approx(MAX_CORRECTION)
    later = 1.0 + 3 * TAIL_QUIET_S
    assert tail(predictor, later) == pytest.approx(MAX_CORRECTION**0.25)
    predicted = predictor.wait_s("l", "t", 0, 0, later)
    predictor.unserved("l", False, predicted, 3.0, later, DROPPED)
    lifted = MAX_CORRECTION**0.25 * math.exp(TAIL_STEP * TAIL_QUANTILE)
    assert tail(predictor, later) == pytest.approx(lifted)


def test_the_time_after_dispatch_shortens_the_queue_budget():
    predictor = WaitPredictor()
    predictor.first_token("l", 0.5)
    assert predictor.ttft_s("l", 1.0) == pytest.approx(1.5)
    assert predictor.budget_s("l", 2.0) == pytest.approx(1.5)
    predictor.first_token("other", 5.0)
    assert predictor.budget_s("other", 2.0) == pytest.approx(0.2), "never below a tenth"


def test_a_prompt_whose_own_prefill_outlasts_the_lanes_time_after_dispatch_is_judged_by_it():
    predictor = WaitPredictor()
    predictor.first_token("l", 0.5)
    assert predictor.ttft_s("l", 1.0, own_prefill_s=0.2) == pytest.approx(1.5)
    assert predictor.budget_s("l", 2.0, own_prefill_s=0.2) == pytest.approx(1.5)
    assert predictor.ttft_s("l", 1.0, own_prefill_s=0.8) == pytest.approx(1.8)
    assert predictor.budget_s("l", 2.0, own_prefill_s=0.8) == pytest.approx(1.2)
    predictor.first_token("slow", 5.0)
    assert predictor.budget_s("slow", 2.0, own_prefill_s=1.0) == pytest.approx(0.2)
    assert predictor.budget_s("slow", 2.0, own_prefill_s=1.9) == pytest.approx(0.1), "no floor"
    assert predictor.budget_s("slow", 2.0, own_prefill_s=2.5) == 0.0


def test_the_budget_leaves_room_for_the_95th_percentile_after_dispatch_not_the_mean():
    """Nine first tokens in ten come 0.5 s after dispatch and one 1.5 s after: the mean
    (about 0.6 s) would leave 1.4 s of a 2 s promise to the queue and one request in
    ten late; the 95th percentile (1.5 s) leaves 0.5 s."""
    predictor = WaitPredictor()
    for _ in range(300):
        for after in (0.5,) * 9 + (1.5,):
            predictor.first_token("l", after)
    assert predictor.lane("l").after_dispatch_s == pytest.approx(0.6, abs=0.15)
    assert predictor.budget_s("l", 2.0) == pytest.approx(0.5, abs=0.1)
    assert predictor.ttft_s("l", 0.2) == pytest.approx(1.7, abs=0.1)


def test_codel_sheds_only_after_an_interval_above_target_and_then_faster():
    shedder = Shedder()
    target = 1.0
    interval = 0.5
    assert not shedder.should_shed(0.0, 0.9, target)
    assert not shedder.should_shed(0.1, 1.2, target), "first time above: start the interval"
    assert not shedder.should_shed(0.1 + interval - 0.01, 1.2, target)
    assert shedder.should_shed(0.1 + interval, 1.2, target)
    now = 0.1 + interval
    assert not shedder.should_shed(now + 0.01, 1.2, target), "next drop an interval later"
    assert shedder.should_shed(now + interval, 1.2, target)
    second = now + interval
    assert not shedder.should_shed(second + interval / 2**0.5 - 0.01, 1.2, target)
    assert shedder.should_shed(second + interval / 2**0.5, 1.2, target)
    assert not shedder.should_shed(5.0, 0.5, target), "below target: shedding stops"
    assert not shedder.dropping
    assert shedder.shed == 3


def queue_of(fairness, lane=PROMISED) -> LaneQueue:
    return LaneQueue(lane, fairness)


async def test_a_newcomers_place_in_the_fair_order_counts_others_only_up_to_its_turn(clock):
    queue = queue_of(VirtualTokenCounter({"b": 2.0}))
    for tenant, count in (("a", 3), ("b", 3)):
        for _ in range(count):
            queue.push(Waiter(attempt(clock, tenant=tenant, lane=PROMISED), clock.now(), None))
    assert queue.place("c", retried=False).ahead == 1 + 1, "a's first, b's first"
    assert queue.place("a", retried=False) == Place(3 + 3, 3, clock.now()), "behind its own"
    assert queue_of(RoundRobin()).place("a", retried=False).ahead == 0


async def test_a_tenant_with_fewer_in_flight_for_its_weight_is_placed_before_the_others(clock):
    fairness = VirtualTokenCounter()
    queue = queue_of(fairness)
    fairness.in_flight("big", 6)
    for tenant, count in (("big", 2), ("small", 1)):
        for _ in range(count):
            queue.push(Waiter(attempt(clock, tenant=tenant, lane=PROMISED), clock.now(), None))
    assert queue.place("small", retried=False).ahead == 1, "only its own: big holds six"
    assert queue.place("big", retried=False).ahead == 2 + 1


async def test_a_newcomer_within_its_share_is_placed_among_the_requests_within_theirs(clock):
    """`heavy` came alone, so two of its four queued requests came within its share.
    A newcomer of `light` within its own counts only those two, and of them only the
    ones the fair order serves first: none while heavy holds three in flight, one (a
    tie) once it holds none; heavy's next counts its own two."""
    fairness = VirtualTokenCounter()
    queue = queue_of(fairness)
    for within_share in (False, False, True, True):
        waiter = Waiter(
            attempt(clock, tenant="heavy", lane=PROMISED), clock.now(), None, within_share
        )
        queue.push(waiter)
    fairness.in_flight("heavy", 3)
    assert queue.within_share_place("light", nothing_asked) == Place(0, 0, None)
    fairness.in_flight("heavy", -3)
    assert queue.within_share_place("light", nothing_asked) == Place(1, 0, None)
    assert queue.within_share_place("heavy", nothing_asked) == Place(2, 2, None)


def nothing_asked(flow: str) -> float:
    """No tenant asked any work lately (the engine's unit not learnt yet): the fair order
    alone places the requests within their share."""
    return 0.0


async def test_among_the_requests_within_their_share_the_lighter_tenant_stands_first(clock):
    """Whatever the fair order: `light` (asked 1 s of the engine lately) stands before
    heavy's two protected requests though heavy holds nothing in flight (a tie by the
    fair order), and a third tenant that asked more than heavy stands behind them; the
    head served is light's."""
    fairness = VirtualTokenCounter()
    queue = queue_of(fairness)
    asked = {"light": 1.0, "heavy": 3.0, "heavier": 5.0}.__getitem__
    for tenant, within_share in (("heavy", True), ("heavy", True), ("light", True)):
        waiter = Waiter(
            attempt(clock, tenant=tenant, lane=PROMISED), clock.now(), None, within_share
        )
        queue.push(waiter)
    fairness.in_flight("light", 2)
    assert queue.within_share_place("light", asked) == Place(1, 1, None)
    assert queue.within_share_place("heavier", asked) == Place(3, 0, None)
    heads = [queue.within_share_head(order) for order in (asked, nothing_asked)]
    assert [None if head is None else head.flow for head in heads] == ["light", "heavy"]


@pytest.mark.parametrize("seed", range(40))
async def test_a_newcomers_predicted_place_is_where_the_fair_order_serves_it(clock, seed):
    """Equal costs, nothing finishing: walk the policy's own picks until the newcomer
    goes; the place predicted is that count, or more by at most one tie per tenant."""
    rng = random.Random(seed)
    names = [f"t{i}" for i in range(rng.randint(2, 5))]
    fairness = VirtualTokenCounter({name: float(rng.choice((1, 2, 4))) for name in names})
    queue = queue_of(fairness)
    for name in names:
        fairness.in_flight(name, rng.randint(0, 6))
        for _ in range(rng.randint(0, 5)):
            queue.push(Waiter(attempt(clock, tenant=name, lane=PROMISED), clock.now(), None))
    newcomer = Waiter(attempt(clock, tenant=names[0], lane=PROMISED), clock.now(), None)
    predicted = queue.place(names[0], retried=False).ahead
    queue.push(newcomer)
    served = 0
    while (head := queue.head()) is not newcomer:
        assert head is not None
        queue.remove(head)
        fairness.charge(head.flow, 10, 0)
        fairness.in_flight(head.flow, 1)
        served += 1
    assert served <= predicted <= served + len(names) - 1


def test_a_tenant_held_back_to_its_own_pace_is_predicted_at_that_pace():
    """The backend dispatches every 0.1 s, the heavy tenant only every 1 s of them: its
    newcomer behind two of its own waits three of its gaps, not three of the lane's."""
    predictor = WaitPredictor()
    for step in range(31):
        predictor.dispatched(step * 0.1, from_queue=True, still_queued=True)
    for now in (0.0, 1.0, 2.0, 3.0):
        predictor.flow_dispatched("l", "heavy", now, backlogged_since_s=0.0)
    assert predictor.wait_s("l", "light", 0, 0, 3.0) == pytest.approx(0.1)
    assert predictor.wait_s("l", "heavy", 2, 2, 3.0, 0.0) == pytest.approx(3 * 1.0)
    assert predictor.wait_s("l", "heavy", 2, 2, 3.0) == pytest.approx(3 * 0.1), "not queued"
    assert predictor.wait_s("l", "heavy", 2, 2, 3.0, 3.5) == pytest.approx(3 * 0.1), (
        "a new backlog has no pace yet"
    )


def test_time_between_two_backlogs_is_no_pace():
    predictor = WaitPredictor()
    for now in (0.0, 0.1):
        predictor.dispatched(now, from_queue=True, still_queued=True)
    predictor.flow_dispatched("l", "t", 0.0, backlogged_since_s=0.0)
    predictor.flow_dispatched("l", "t", 0.1, backlogged_since_s=0.0)
    predictor.flow_dispatched("l", "t", 60.0, backlogged_since_s=59.9)
    assert predictor.lane("l").flows["t"].gap_s is None
    predictor.flow_dispatched("l", "t", 60.2, backlogged_since_s=59.9)
    assert predictor.lane("l").flows["t"].gap_s == pytest.approx(0.2)


async def test_the_tenant_above_its_share_is_refused_and_the_one_below_it_queues(clock):
    """A heavy tenant with 3 in flight and 3 queued, a light one with none, 0.4 s per
    dispatch and a 2 s promise: the heavy newcomer waits its own three turns and its fourth (1.6 s)
    plus 0.6 s after dispatch: refused; the light one goes after one of them: queued."""
    pool = Pool(PoolSpec("p", 3), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    dispatcher.rule.predictor.first_token("promised", 0.6)
    grants = [
        await granted(dispatcher, attempt(clock, tenant="heavy", lane=PROMISED)) for _ in range(3)
    ]
    queued = [
        asyncio.create_task(granted(dispatcher, attempt(clock, tenant="heavy", lane=PROMISED)))
        for _ in range(3)
    ]
    await settle()
    dispatcher.rule.predictor.gap_s = 0.4
    with pytest.raises(GatewayError) as info:
        await granted(dispatcher, attempt(clock, tenant="heavy", lane=PROMISED))
    assert (info.value.status, info.value.code, info.value.retry_after_s) == (
        503,
        "overloaded",
        None,
    )
    light = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="light", lane=PROMISED)))
    await settle()
    assert not light.done()
    assert dispatcher.queues["promised"].size == 4
    for task in [*queued, light]:
        task.cancel()
    for grant in grants:
        await dispatcher.release(grant)


async def test_a_backend_that_stops_makes_its_queue_shed_from_the_head(clock):
    """Nothing is released. Once the head has waited past CoDel's target (half the 2 s
    budget) for an interval (half that), the next look sheds it, with no Retry-After; at
    the budget the rest expire, never to be served late."""
    pool = Pool(PoolSpec("p", 3), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        grants = [await granted(dispatcher, attempt(clock, lane=PROMISED)) for _ in range(3)]
        waiters = [
            asyncio.create_task(granted(dispatcher, attempt(clock, lane=PROMISED)))
            for _ in range(3)
        ]
        await settle()
        for step_s in (1.1, 0.4):
            clock.advance(step_s)
            dispatcher.kick()
            await settle()
            assert not any(w.done() for w in waiters)
        clock.advance(0.1)
        dispatcher.kick()
        await settle()
        shed = [w for w in waiters if w.done()]
        assert len(shed) == 1
        error = shed[0].exception()
        assert isinstance(error, GatewayError)
        assert (error.code, error.retry_after_s) == ("shed", None)
        assert dispatcher.view().lanes[0].shed == 1
        clock.advance(2.0 - 1.6)
        await settle()
        assert all(w.done() for w in waiters)
        assert {w.exception().code for w in waiters if w not in shed} == {"expired"}
        for grant in grants:
            await dispatcher.release(grant)
    finally:
        runner.cancel()


@pytest.mark.parametrize(
    ("code", "steps_s", "looks"),
    [("expired", (2.0,), False), ("shed", (1.1, 0.5), True)],
)
async def test_a_request_that_leaves_unserved_corrects_its_class_of_predictions(
    clock, code, steps_s, looks
):
    """A request beyond its share queued on a 0.1 s prediction, behind a holder that
    never ends: it expires at its 2 s budget, or, when the dispatcher keeps looking at
    its queue, CoDel sheds it at 1.6 s. Nobody was dispatched to compare with, but the
    predictor learns from the wait it outlasted, and only for requests beyond their
    share."""
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        holder = await granted(dispatcher, attempt(clock, tenant="heavy", lane=PROMISED))
        dispatcher.rule.predictor.gap_s = 0.1
        waiter = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="heavy", lane=PROMISED))
        )
        await settle()
        for step_s in steps_s:
            clock.advance(step_s)
            if looks:
                dispatcher.kick()
            await settle()
        error = waiter.exception()
        assert isinstance(error, GatewayError)
        assert error.code == code
        lane = dispatcher.view().lanes[0]
        assert lane.wait_correction == pytest.approx(MAX_CORRECTION**CORRECTION_SMOOTHING)
        assert lane.wait_correction_within_share == 1.0
        await dispatcher.release(holder)
    finally:
        runner.cancel()


async def test_after_requests_expire_the_queue_refuses_at_once_what_only_its_centre_admits(
    clock,
):
    """On a 0.5 s gap behind a holder that never ends, two requests queue on 0.5 s and
    ~0.57 s predictions and expire at the 2 s budget. Their waits lift the correction
    (to ~1.3) and the tail (to ~1.43). A third newcomer of that tenant behind two of its
    queued requests is predicted ~1.95 s: inside the 2 s promise at the centre, beyond
    it at the tail, so it is refused at once rather than left to expire. Tenants within
    their share are admitted by the centre: the third of them, predicted 1.5 s behind
    the other two (2.1 s at the tail), queues."""
    pool = Pool(PoolSpec("p", 1), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    holder = await granted(dispatcher, attempt(clock, lane=PROMISED))
    dispatcher.rule.predictor.gap_s = 0.5
    tasks: list[asyncio.Task[Attempt]] = []

    def arrive(tenant: str = "a") -> asyncio.Task[Attempt]:
        task = asyncio.create_task(granted(dispatcher, attempt(clock, tenant, lane=PROMISED)))
        tasks.append(task)
        return task

    try:
        for _ in range(2):
            waiter = arrive()
            await settle()
            clock.advance(2.0)
            await settle()
            error = waiter.exception()
            assert isinstance(error, GatewayError)
            assert error.code == "expired"
        queued = [arrive(), arrive()]
        await settle()
        assert not any(task.done() for task in queued)
        predictor = dispatcher.rule.predictor
        centre = predictor.wait_s("promised", "a", 2, 2, clock.now())
        assert centre is not None
        assert 1.9 < centre < 2.0
        newcomer = arrive()
        await settle()
        assert newcomer.done(), "admitted to a queue that would let it expire"
        error = newcomer.exception()
        assert isinstance(error, GatewayError)
        assert (error.code, error.retry_after_s) == ("overloaded", None)
        assert dispatcher.view().lanes[0].wait_tail == pytest.approx(
            math.exp(2 * TAIL_STEP * TAIL_QUANTILE)
        )
        within = [arrive(tenant) for tenant in ("b", "c", "d")]
        await settle()
        assert dispatcher.queues["promised"].within_share == 3
        assert not any(task.done() for task in within), "within share: by the centre"
    finally:
        for task in tasks:
            task.cancel()
        await dispatcher.release(holder)


async def heavy_holds_both(dispatcher: Dispatcher, clock: FakeClock) -> list[Attempt]:
    return [
        await granted(dispatcher, attempt(clock, tenant="heavy", lane=PROMISED)) for _ in range(2)
    ]


async def test_a_tenant_passed_by_the_others_sheds_its_own_late_requests(clock):
    """The heavy tenant holds both slots, so the fair order serves the light one's
    newcomers first and the heavy queue's head ages. Light heads on time must not hide
    that: the heavy head is shed once it has waited past CoDel's target for an interval,
    before it would expire."""
    pool = Pool(PoolSpec("p", 2), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        grants = await heavy_holds_both(dispatcher, clock)
        heavy = [
            asyncio.create_task(granted(dispatcher, attempt(clock, tenant="heavy", lane=PROMISED)))
            for _ in range(2)
        ]
        await settle()
        light = []
        for step_s in (1.1, 0.6):
            clock.advance(step_s)
            light.append(
                asyncio.create_task(
                    granted(dispatcher, attempt(clock, tenant="light", lane=PROMISED))
                )
            )
            await settle()
        assert [w.done() for w in heavy] == [True, False]
        error = heavy[0].exception()
        assert isinstance(error, GatewayError)
        assert error.code == "shed"
        assert not any(w.done() for w in light)
        for waiter in [*heavy, *light]:
            waiter.cancel()
        for grant in grants:
            await dispatcher.release(grant)
    finally:
        runner.cancel()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_a_tenant_within_its_share_is_not_shed_but_waits_for_the_next_slot(clock):
    """`heavy` holds both slots and `light` has nothing in flight: light's queued request
    is within its share and first in line, so it is never shed while it waits (heavy's
    late head is), and it takes the slot that frees before its budget ends."""
    pool = Pool(PoolSpec("p", 2), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        grants = await heavy_holds_both(dispatcher, clock)
        heavy = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="heavy", lane=PROMISED))
        )
        light = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="light", lane=PROMISED))
        )
        await settle()
        for _ in range(8):
            clock.advance(0.2)
            dispatcher.kick()
            await settle()
        assert heavy.done()
        assert heavy.exception().code == "shed"
        assert not light.done()
        await dispatcher.release(grants.pop())
        await settle()
        assert light.done()
        assert light.exception() is None
        await dispatcher.release(grants.pop())
    finally:
        runner.cancel()


async def light_behind_its_own_backlog(
    dispatcher: Dispatcher, pool: Pool, clock: FakeClock
) -> tuple[list[Attempt], list[PoolPermit], asyncio.Task[Attempt]]:
    """On a pool of 4 shared by `heavy` and `light` (2 each), light's third request came
    beyond its share and queued; then light's two in flight ended and others outside
    the fair order took their slots. Light, with one request queued and none in flight,
    is now within its share again."""
    dispatcher.rule.predictor.first_token("promised", 0.6)
    held = [
        await granted(dispatcher, attempt(clock, tenant=tenant, lane=PROMISED))
        for tenant in ("heavy", "heavy", "light", "light")
    ]
    beyond = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="light", lane=PROMISED)))
    await settle()
    assert not beyond.done()
    for grant in held[2:]:
        await dispatcher.release(grant)
    assert not beyond.done()
    others = [await dispatcher.targets[0].group.acquire(10) for _ in range(2)]
    permits = [permit for permit in others if isinstance(permit, PoolPermit)]
    assert len(permits) == pool.counters.active - 2 == 2
    return held[:2], permits, beyond


async def test_a_request_within_its_share_is_promised_its_place_among_those_within_theirs(clock):
    """Light's queued request, beyond its share, has been dispatched once in 0.9 s: at
    that pace a newcomer behind it would wait 1.8 s, with 0.6 s after dispatch beyond
    the 2 s promise. But the newcomer is within light's share: it goes before that
    request, first among the requests within their share (none queued), so its wait is
    one service gap, 0.1 s, and it queues instead of being refused."""
    pool = Pool(PoolSpec("p", 4), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    held, others, beyond = await light_behind_its_own_backlog(dispatcher, pool, clock)
    since_s = dispatcher.queues["promised"].backlogged_since("light")
    assert since_s is not None
    dispatcher.rule.predictor.flow_dispatched("promised", "light", since_s, since_s)
    clock.advance(0.9)
    dispatcher.rule.predictor.flow_dispatched("promised", "light", clock.now(), since_s)
    dispatcher.rule.predictor.gap_s = 0.1
    within = asyncio.create_task(granted(dispatcher, attempt(clock, tenant="light", lane=PROMISED)))
    await settle()
    assert not within.done(), within.exception() if within.done() else None
    assert dispatcher.queues["promised"].within_share == 1
    for task in (beyond, within):
        task.cancel()
    await settle()
    for grant in held:
        await dispatcher.release(grant)
    for permit in others:
        await permit.release(None)


async def test_a_request_within_its_share_goes_before_its_tenants_backlog_beyond_it(clock):
    """A slot frees while light has its request beyond its share queued, and one within
    it behind: the one within goes. The older one may not take the slot the reserve
    keeps, and standing first it would keep the other waiting with it."""
    pool = Pool(PoolSpec("p", 4), leases(clock))
    dispatcher = dispatcher_for([PROMISED], pool, clock)
    runner = asyncio.create_task(dispatcher.run())
    try:
        reserving(dispatcher, 1)
        held, others, beyond = await light_behind_its_own_backlog(dispatcher, pool, clock)
        within = asyncio.create_task(
            granted(dispatcher, attempt(clock, tenant="light", lane=PROMISED))
        )
        await settle()
        assert not within.done()
        await others.pop().release(None)
        await settle()
        assert within.done()
        assert within.exception() is None
        assert not beyond.done()
        beyond.cancel()
        await settle()
        for grant in [*held, within.result()]:
            await dispatcher.release(grant)
        for permit in others:
            await permit.release(None)
    finally:
        runner.cancel()
