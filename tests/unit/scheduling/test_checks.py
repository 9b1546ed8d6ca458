"""Every dispatch check: what it records on dispatch it undoes on withdrawal and on
release, whatever the outcome; and each says why it refuses, with its own code."""

from __future__ import annotations

import pytest

from sluicegate.capacity.breaker import Breaker
from sluicegate.capacity.gates import AimdGate, OpenGate
from sluicegate.capacity.pools import Pool
from sluicegate.core.call import Call
from sluicegate.core.leases import Leases
from sluicegate.core.types import (
    AdaptiveLimit,
    BreakerPolicy,
    Deployment,
    Endpoint,
    Lane,
    Model,
    PoolSpec,
    RoutePolicy,
    Tenant,
    Timeouts,
)
from sluicegate.scheduling.attempt import Attempt, Outcome, Target
from sluicegate.scheduling.checks import BreakerCheck, GateCheck, ShareCheck, default_checks
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock

HALF = Lane("half", max_share=0.5)
TOP = Lane("top", priority=100)
DEPLOYMENT = Deployment("d", "openai", "http://x/v1", "m", None, Timeouts(1, 1, 1), 8, ("p",))


def target(clock: FakeClock) -> Target:
    pool = Pool(PoolSpec("p", 4), Leases(MemoryLimitStore(clock), clock))
    gate = AimdGate(AdaptiveLimit(4, 1, 8, 1.0, 0.5))
    return Target(DEPLOYMENT, (pool,), gate, Breaker(BreakerPolicy(), clock))


def ended(outcome: Outcome, stream: bool = True) -> Attempt:
    call = Call(
        Endpoint.CHAT,
        Tenant("a", None),
        Model("m", ()),
        RoutePolicy(),
        HALF,
        {},
        stream,
        0.0,
        10.0,
        1,
        2,
    )
    return Attempt(call, dispatched_s=0.0, first_byte_s=0.5, outcome=outcome)


def checks(clock: FakeClock) -> tuple:
    """The default checks, the top lane above `HALF` busy since the start."""
    return default_checks((TOP, HALF), clock, 30.0)


def counts(t: Target, check) -> tuple:
    return (t.breaker.in_flight, t.gate.in_flight, dict(check.view().get("in_use", {})))


@pytest.mark.parametrize("index", range(len(checks(FakeClock()))))
@pytest.mark.parametrize("outcome", list(Outcome))
def test_taken_is_undone_by_withdrawn_and_by_released(index, outcome):
    clock = FakeClock()
    t, check = target(clock), checks(clock)[index]
    before = counts(t, check)
    for _ in range(2):
        check.taken(t, HALF, ended(Outcome.OK))
    assert counts(t, check) != before
    check.withdrawn(t, HALF, ended(Outcome.OK))
    check.released(t, HALF, ended(outcome))
    assert counts(t, check) == before


def test_the_share_check_refuses_at_the_lanes_share_of_each_pool():
    clock = FakeClock()
    t, check = target(clock), ShareCheck((TOP, HALF), clock, 30.0)
    for _ in range(2):
        assert check.check(t, HALF) is None
        check.taken(t, HALF, ended(Outcome.OK))
    verdict = check.check(t, HALF)
    assert verdict is not None
    assert verdict.reason == "lane_share_exhausted"
    assert check.check(t, Lane("full")) is None


def test_the_breaker_check_refuses_for_the_ramp_only_while_ramping():
    """At full capacity without a ramp the pool, not the breaker, says no."""
    clock = FakeClock()
    t, check = target(clock), BreakerCheck()
    for _ in range(4):
        check.taken(t, HALF, ended(Outcome.OK))
    assert check.check(t, HALF) is None
    t.breaker.ramp_after(0)
    clock.advance(0.1)
    verdict = check.check(t, HALF)
    assert verdict is not None
    assert verdict.reason == "deployment_ramping_up"
    assert verdict.retry_after_s is None


def test_only_evidence_teaches_the_adaptive_gate():
    clock = FakeClock()
    t, check = target(clock), GateCheck()
    slow = AdaptiveLimit(4, 1, 8, 0.1, 0.5)
    t.gate = AimdGate(slow)
    for outcome in (Outcome.ABANDONED, Outcome.REJECTED):
        for _ in range(4):
            check.taken(t, HALF, ended(Outcome.OK))
            check.released(t, HALF, ended(outcome))
    assert t.gate.limit == 4
    for _ in range(4):
        check.taken(t, HALF, ended(Outcome.OK))
        check.released(t, HALF, ended(Outcome.OK, stream=False))
    assert t.gate.limit == 4, "a non-streamed answer's first byte is its whole body"
    for _ in range(4):
        check.taken(t, HALF, ended(Outcome.OK))
        check.released(t, HALF, ended(Outcome.FAILED))
    assert t.gate.limit < 4


def test_a_gate_without_a_backend_signal_is_left_out_of_the_plan():
    clock = FakeClock()
    t = target(clock)
    assert all(check.applies(t, HALF) for check in checks(clock))
    t.gate = OpenGate()
    assert [c.name for c in checks(clock) if c.applies(t, HALF)] == ["breaker", "lane_share"]
