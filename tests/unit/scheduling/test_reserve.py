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


def test_a_reserve_of_none_keeps_nothing():
    reserve = Reserve(16, 0.0)
    for second in range(100):
        reserve.arrived(second / 10)
    assert reserve.slots(10.0, 0.1) == 0


def test_the_reserve_is_given_back_once_protected_traffic_stops():
    """Silent for five of its mean gaps (3/s: 1.7 s), the protected traffic is gone."""
    reserve, now = reserve_at(3.0)
    assert reserve.slots(now + 1.5, 0.1) > 0
    assert reserve.slots(now + 1.8, 0.1) == 0


def test_rare_protected_traffic_keeps_its_reserve_for_at_most_thirty_seconds():
    """One protected request every 10 s: five gaps would be 50 s; the reserve stays for
    the 30 s cap only."""
    reserve, now = reserve_at(0.1)
    assert reserve.slots(now + GONE_AFTER_S - 1, 1.0) > 0
    assert reserve.slots(now + GONE_AFTER_S + 1, 1.0) == 0


def test_the_reserve_is_worked_out_again_at_most_every_fifty_milliseconds():
    reserve = Reserve(16)
    assert reserve.slots(0.0, 0.1) == 0
    reserve.arrived(0.01)
    assert reserve.slots(0.02, 0.1) == 0
    assert reserve.slots(0.06, 0.1) == 1


def test_the_max_min_level():
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}
    assert max_min_level({"a": 1, "b": 10, "c": 10}, weights.get, 8) == pytest.approx(7 / 3)
    assert max_min_level({"a": 1, "b": 2}, weights.get, 8) == math.inf


def vtc(in_flight: dict[str, int], weights: dict[str, float] | None = None):
    policy = VirtualTokenCounter(weights)
    for flow, count in in_flight.items():
        policy.in_flight(flow, count)
    return policy


def none_queued(flow: str) -> int:
    return 0


def test_a_flow_with_nothing_before_it_is_within_its_share():
    assert vtc({"big": 8}).within_share("new", none_queued, 8)


def test_a_flow_whose_whole_demand_fits_is_within_its_share():
    """`big` may hold 7 of 8 while `small` asks for 1."""
    assert vtc({"big": 6, "small": 1}).within_share("big", none_queued, 8)
    assert not vtc({"big": 7, "small": 1}).within_share("big", none_queued, 8)


def test_a_burst_is_within_its_share_up_to_its_share():
    """Arriving one by one beside `big`'s backlog, `burst` (weight 1 of 2) comes within
    its share for its first 4 of 8, queued or not."""
    policy = vtc({"big": 4})
    policy.backlogged("big")
    queued = {"big": 10, "burst": 0}
    within = []
    for _ in range(6):
        within.append(policy.within_share("burst", queued.get, 8))
        queued["burst"] += 1
    assert within == [True] * 4 + [False] * 2


def test_weights_set_the_share():
    """Weighted 3 to 1 against `big`'s backlog, `light`'s share of 8 is 6."""
    weights = {"big": 1.0, "light": 3.0}
    queued = {"big": 10}

    def backlogged(light: int):
        policy = vtc({"big": 2, "light": light}, weights)
        policy.backlogged("big")
        return policy.within_share("light", lambda flow: queued.get(flow, 0), 8)

    assert backlogged(5)
    assert not backlogged(6)


def test_round_robin_counts_in_flight_for_the_share_alone():
    policy = RoundRobin()
    policy.in_flight("big", 6)
    policy.in_flight("small", 1)
    policy.backlogged("big")
    backlog = {"big": 3}
    assert not policy.within_share("big", lambda flow: backlog.get(flow, 0), 8)
    assert policy.within_share("small", lambda flow: backlog.get(flow, 0), 8)


def test_blocking_never_overflows_on_a_large_batch_or_load():
    assert blocking(5.0, 500) == pytest.approx(0.8)
    reserve, now = reserve_at(200.0, batch=2048)
    assert reserve.slots(now, 0.1) == 512
