"""The reserve's size on a fake clock, and who is within its share."""

from __future__ import annotations

import math

import pytest

from sluicegate.scheduling.fairness import RoundRobin, VirtualTokenCounter, max_min_level
from sluicegate.scheduling.reserve import GONE_AFTER_S, HORIZON_S, Reserve, blocking


def test_blocking_is_the_full_queues_probability():
    assert blocking(0.3, 0) == 1.0
    assert blocking(0.3, 2) == pytest.approx(0.7 * 0.09 / (1 - 0.027))
    assert blocking(1.0, 3) == pytest.approx(0.25)


def reserve_at(rate_per_s: float, batch: int = 16) -> tuple[Reserve, float]:
    """A reserve that has seen protected arrivals at `rate_per_s` for a long while."""
    reserve = Reserve(batch)
    now, step = 0.0, 1.0 / rate_per_s
    for _ in range(int(10 * HORIZON_S * rate_per_s)):
        now += step
        reserve.arrived(now)
    return reserve, now


def test_the_reserve_is_the_fewest_slots_that_keep_blocking_under_five_percent():
    """Load 0.3 (protected arrivals at 3/s, a completion every 0.1 s): two slots leave
    6.6 % of arrivals without one, three 1.9 %."""
    reserve, now = reserve_at(3.0)
    assert reserve.rate_per_s(now) == pytest.approx(3.0, rel=0.1)
    assert reserve.slots(now, 0.1) == 3


def test_no_protected_traffic_or_no_measured_gap_keeps_nothing():
    assert Reserve(16).slots(0.0, 0.1) == 0
    reserve, now = reserve_at(3.0)
    assert reserve.slots(now, None) == 0


def test_the_reserve_never_passes_a_quarter_of_the_batch():
    reserve, now = reserve_at(50.0, batch=8)
    assert reserve.slots(now, 0.1) == 2


def test_the_reserve_is_given_back_once_protected_traffic_stops():
    reserve, now = reserve_at(3.0)
    assert reserve.slots(now + HORIZON_S, 0.1) > 0
    assert reserve.slots(now + GONE_AFTER_S - 1, 0.1) > 0
    assert reserve.slots(now + GONE_AFTER_S + 1, 0.1) == 0


def test_the_reserve_is_worked_out_again_at_most_every_fifty_milliseconds():
    reserve = Reserve(16)
    assert reserve.slots(0.0, 0.1) == 0
    reserve.arrived(0.01)
    assert reserve.slots(0.02, 0.1) == 0
    assert reserve.slots(0.06, 0.1) == 1


def test_the_max_min_level():
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}
    assert max_min_level({"a": 1, "b": 10, "c": 10}, weights, 8) == pytest.approx(7 / 3)
    assert max_min_level({"a": 1, "b": 2}, weights, 8) == math.inf


def vtc(in_flight: dict[str, int], weights: dict[str, float] | None = None):
    policy = VirtualTokenCounter(weights)
    for flow, count in in_flight.items():
        policy.in_flight(flow, count)
    return policy


def test_a_flow_with_nothing_in_flight_is_within_its_share():
    assert vtc({"big": 8}).within_share("new", lambda flow: 0, 8, arriving=True)


def test_a_flow_whose_whole_demand_fits_is_within_its_share():
    """`big` may hold 7 of 8 while `small` asks for 1: its demand fits under the level."""
    policy = vtc({"big": 6, "small": 1})
    assert policy.within_share("big", lambda flow: 0, 8, arriving=True)


def test_a_flow_with_a_backlog_beyond_the_level_is_within_only_below_its_weighted_share():
    """With a backlog `big` asks for more than the 7 `small` leaves: what it borrowed
    beyond its half is small's the moment small asks, so it is not within its share."""
    policy = vtc({"big": 6, "small": 1})
    backlog = {"big": 3}
    policy.backlogged("big")
    assert not policy.within_share("big", lambda flow: backlog.get(flow, 0), 8, arriving=False)
    policy.in_flight("big", -3)
    assert policy.within_share("big", lambda flow: backlog.get(flow, 0), 8, arriving=False)


def test_weights_set_the_weighted_share():
    """Weighted 3 to 1, `big`'s share of 8 is 6."""
    backlog = {"big": 5}
    for held, within in ((5, True), (6, False)):
        policy = vtc({"big": held, "small": 1}, {"big": 3.0, "small": 1.0})
        policy.backlogged("big")
        got = policy.within_share("big", lambda flow: backlog.get(flow, 0), 8, arriving=False)
        assert got is within


def test_round_robin_counts_in_flight_for_the_share_alone():
    policy = RoundRobin()
    policy.in_flight("big", 6)
    policy.in_flight("small", 1)
    policy.backlogged("big")
    assert not policy.within_share("big", lambda flow: 3, 8, arriving=False)
    assert policy.within_share("small", lambda flow: 0, 8, arriving=True)
