"""Who is within its tenant's share: the max-min level and each fairness policy's verdict."""

from __future__ import annotations

import math

import pytest

from sluicegate.scheduling.fairness import RoundRobin, VirtualTokenCounter, max_min_level


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
