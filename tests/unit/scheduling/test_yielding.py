"""The lower lanes' pace follows the protected lane's time to first token (fake clock)."""

from __future__ import annotations

import pytest

from sluicegate.scheduling.yielding import (
    DECIDE_S,
    FLOOR_RATE_PER_S,
    MEASURE_S,
    QUIET_S,
    Yielding,
)
from tests.support.clock import FakeClock

TARGET_S = 0.1


def busy_background(y: Yielding, clock: FakeClock, per_s: int, seconds: int) -> None:
    """Lower lanes dispatch `per_s` times a second, as often as the limit lets them."""
    for _ in range(seconds * per_s):
        clock.advance(1 / per_s)
        if y.wait_s() == 0:
            y.dispatched()


def decide(y: Yielding, clock: FakeClock, ttft_s: float | None) -> None:
    """One decision interval in which the protected lane saw `ttft_s` (None: nothing)."""
    if ttft_s is not None:
        y.observe(ttft_s)
    clock.advance(DECIDE_S)
    y.wait_s()


def test_unlimited_while_the_protected_lane_is_quiet():
    clock = FakeClock()
    y = Yielding(TARGET_S, clock)
    busy_background(y, clock, per_s=20, seconds=5)
    assert y.rate_per_s is None
    assert y.wait_s() == 0


def test_an_active_protected_lane_holds_the_measured_rate_then_a_breach_cuts_it():
    clock = FakeClock()
    y = Yielding(TARGET_S, clock)
    busy_background(y, clock, per_s=4, seconds=int(MEASURE_S))
    decide(y, clock, ttft_s=TARGET_S / 2)
    held = y.rate_per_s
    assert held is not None
    assert held == pytest.approx(4, rel=0.15)
    decide(y, clock, ttft_s=TARGET_S * 4)
    assert y.rate_per_s == pytest.approx(held * 0.5)
    assert y.cuts == 1


def test_a_small_breach_costs_little_and_calm_grows_the_rate_back():
    clock = FakeClock()
    y = Yielding(TARGET_S, clock)
    busy_background(y, clock, per_s=4, seconds=int(MEASURE_S))
    decide(y, clock, ttft_s=TARGET_S / 2)
    before = y.rate_per_s
    decide(y, clock, ttft_s=TARGET_S * 1.05)
    assert before is not None
    assert y.rate_per_s is not None
    after_cut = y.rate_per_s
    assert 0.85 * before < after_cut < before
    decide(y, clock, ttft_s=TARGET_S / 2)
    assert y.rate_per_s > after_cut


def test_dispatches_are_spaced_by_the_rate():
    clock = FakeClock()
    y = Yielding(TARGET_S, clock)
    busy_background(y, clock, per_s=4, seconds=int(MEASURE_S))
    decide(y, clock, ttft_s=TARGET_S * 10)
    rate = y.rate_per_s
    assert rate is not None
    y.dispatched()
    assert y.wait_s() == pytest.approx(1 / rate)


def test_never_below_the_floor_and_lifted_once_the_protected_lane_is_quiet():
    clock = FakeClock()
    y = Yielding(TARGET_S, clock)
    busy_background(y, clock, per_s=4, seconds=int(MEASURE_S))
    for _ in range(30):
        decide(y, clock, ttft_s=TARGET_S * 10)
    assert y.rate_per_s == FLOOR_RATE_PER_S
    for _ in range(int(QUIET_S / DECIDE_S) + 1):
        decide(y, clock, ttft_s=None)
    assert y.rate_per_s is None
    assert y.wait_s() == 0
