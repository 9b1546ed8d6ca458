"""What a slot held by each tenant costs the engine, relative to the average tenant."""

from __future__ import annotations

import math

import pytest

from sluicegate.scheduling.slotcost import SKEW, SlotCosts


def test_every_tenant_costs_the_average_before_anything_ended():
    assert SlotCosts().relative("a") == 1.0


def test_a_tenant_not_seen_costs_the_average():
    costs = SlotCosts()
    costs.held("dear", 4.0, 10.0)
    costs.held("cheap", 1.0, 10.0)
    assert costs.relative("new") == 1.0


def test_costs_are_relative_to_the_average_tenant():
    """0.4 and 0.1 engine seconds per second held: the (geometric) average is 0.2."""
    costs = SlotCosts()
    costs.held("dear", 4.0, 10.0)
    costs.held("cheap", 1.0, 10.0)
    assert costs.relative("dear") == pytest.approx(2.0)
    assert costs.relative("cheap") == pytest.approx(0.5)


def test_one_odd_tenant_does_not_erase_the_others_differences():
    """A tenant at 10 beside two at 0.1 and 0.4: by an arithmetic mean (3.5) both would
    sit at the lower bound, alike; by the geometric one they stay four times apart."""
    costs = SlotCosts()
    costs.held("odd", 10.0, 1.0)
    costs.held("a", 0.1, 1.0)
    costs.held("b", 0.4, 1.0)
    assert costs.relative("b") == pytest.approx(4 * costs.relative("a"))
    assert costs.relative("odd") == SKEW


def test_a_long_request_weighs_what_it_held():
    """Sums, not a mean of ratios: a request that held its slot 100 s at 0.1 and one that
    held it 1 s at 0.9 cost about what the long one did, not 0.5."""
    costs = SlotCosts()
    costs.held("mixed", 10.0, 100.0)
    costs.held("mixed", 0.9, 1.0)
    costs.held("steady", 0.1, 1.0)
    assert costs.relative("mixed") == pytest.approx(costs.relative("steady"), rel=0.01)


def test_a_tenant_follows_its_recent_requests():
    """Each request moves the sums by a tenth: after forty requests of the new kind, the
    old kind is all but forgotten (3 against 1: sqrt(3) over their average)."""
    costs = SlotCosts()
    costs.held("changing", 1.0, 1.0)
    costs.held("steady", 1.0, 1.0)
    for _ in range(40):
        costs.held("changing", 3.0, 1.0)
    assert costs.relative("changing") == pytest.approx(math.sqrt(3), rel=0.01)


def test_a_cost_is_trusted_only_within_its_skew():
    costs = SlotCosts()
    costs.held("dear", 1000.0, 1.0)
    costs.held("free", 0.0, 1.0)
    for _ in range(10):
        costs.held(f"average{_}", 1.0, 1.0)
    assert costs.relative("dear") == SKEW
    assert costs.relative("free") == 1 / SKEW


def test_a_slot_held_no_time_teaches_nothing():
    """a's request held no time: a stays unseen, and b and c are each other's average."""
    costs = SlotCosts()
    costs.held("a", 1.0, 0.0)
    costs.held("b", 1.0, 1.0)
    costs.held("c", 3.0, 1.0)
    assert costs.relative("a") == 1.0
    assert costs.relative("b") == pytest.approx(1 / math.sqrt(3))
