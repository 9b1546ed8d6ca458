"""The circuit breaker's states and timings, on a fake clock."""

from __future__ import annotations

import logging

from sluicegate.capacity.breaker import Breaker, BreakerState
from sluicegate.core.types import BreakerPolicy
from tests.support.clock import FakeClock

POLICY = BreakerPolicy(consecutive_failures=3, open_s=5, max_open_s=12, ramp_s=10)


def tripped() -> tuple[Breaker, FakeClock]:
    clock = FakeClock()
    breaker = Breaker(POLICY, clock, jitter=lambda: 0.5)
    for _ in range(3):
        breaker.started()
        breaker.record(False)
    assert breaker.state is BreakerState.OPEN
    return breaker, clock


def probe(breaker: Breaker, ok: bool) -> None:
    assert breaker.allows()
    breaker.started()
    breaker.record(ok)


def test_failed_probes_double_the_open_time_up_to_the_cap():
    breaker, clock = tripped()
    waits = []
    for _ in range(4):
        waits.append(breaker.reopens_in())
        clock.advance(breaker.reopens_in() or 0)
        probe(breaker, ok=False)
    assert waits == [5, 10, 12, 12]


def test_a_successful_probe_closes_ramps_and_resets_the_open_time():
    breaker, clock = tripped()
    clock.advance(5)
    probe(breaker, ok=False)
    clock.advance(10)
    probe(breaker, ok=True)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.limit(32) == 1
    clock.advance(5)
    assert 1 < breaker.limit(32) < 32
    for _ in range(3):
        breaker.started()
        breaker.record(False)
    assert breaker.reopens_in() == 5


def test_every_transition_is_logged_with_its_deployment(caplog):
    caplog.set_level(logging.INFO, logger="sluicegate.circuit")
    clock = FakeClock()
    breaker = Breaker(POLICY, clock, jitter=lambda: 0.5, name="vllm-a")
    for _ in range(3):
        breaker.started()
        breaker.record(False)
    clock.advance(5)
    probe(breaker, ok=True)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "circuit of deployment vllm-a open for 5s"),
        ("INFO", "circuit of deployment vllm-a half-open: probing"),
        ("INFO", "circuit of deployment vllm-a closed: the deployment answers again"),
    ]
