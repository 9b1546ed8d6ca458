"""One functional suite for every fairness policy, then what only the VTC promises."""

from __future__ import annotations

from collections import Counter

import pytest

from sluicegate.scheduling.fairness import FairnessPolicy, RoundRobin, VirtualTokenCounter

POLICIES = {"vtc": VirtualTokenCounter, "round_robin": RoundRobin}


def serve(policy: FairnessPolicy, rounds: int, cost: dict[str, tuple[int, int]]) -> Counter[str]:
    """Dispatch `rounds` requests from always-backlogged flows; count service in tokens."""
    served: Counter[str] = Counter()
    for _ in range(rounds):
        flow = policy.pick()
        assert flow is not None
        prompt, output = cost[flow]
        policy.charge(flow, prompt, output)
        served[flow] += prompt + output
    return served


@pytest.fixture(params=POLICIES)
def policy(request) -> FairnessPolicy:
    return POLICIES[request.param]()


def test_nothing_backlogged_picks_nothing(policy):
    assert policy.pick() is None
    policy.backlogged("a")
    policy.idle("a")
    assert policy.pick() is None


def test_pick_has_no_side_effect(policy):
    for flow in "abc":
        policy.backlogged(flow)
    assert policy.pick() == policy.pick()


def test_every_backlogged_flow_is_served(policy):
    for flow in "abc":
        policy.backlogged(flow)
    served = serve(policy, 30, {f: (10, 10) for f in "abc"})
    assert set(served) == set("abc")
    assert max(served.values()) - min(served.values()) <= 20


def test_an_idle_flow_is_not_picked(policy):
    for flow in "ab":
        policy.backlogged(flow)
    policy.idle("a")
    assert {policy.pick() for _ in range(3)} == {"b"}


def jain(values) -> float:
    values = list(values)
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def test_vtc_equalises_tokens_not_requests():
    vtc = VirtualTokenCounter()
    for flow in "abc":
        vtc.backlogged(flow)
    served = serve(vtc, 600, {"a": (1000, 500), "b": (100, 50), "c": (10, 300)})
    assert jain(served.values()) >= 0.95


def test_vtc_weights_give_proportional_shares():
    vtc = VirtualTokenCounter(weights={"a": 1, "b": 2, "c": 4})
    for flow in "abc":
        vtc.backlogged(flow)
    served = serve(vtc, 700, {f: (100, 100) for f in "abc"})
    total = sum(served.values())
    for flow, weight in (("a", 1), ("b", 2), ("c", 4)):
        assert served[flow] / total == pytest.approx(weight / 7, rel=0.1)


def test_round_robin_is_fair_by_count_and_blind_to_cost():
    rr = RoundRobin()
    for flow in "ab":
        rr.backlogged(flow)
    served = serve(rr, 100, {"a": (1000, 0), "b": (10, 0)})
    assert served["a"] == 100 * served["b"]


def test_a_returning_tenant_gets_no_more_than_its_share_for_its_idle_time():
    """Tenant b is idle while a is served for a long time (ten minutes of traffic);
    when b returns, the lift rule puts it level with a rather than letting it bank
    ten minutes of credit."""
    vtc = VirtualTokenCounter()
    vtc.backlogged("a")
    serve(vtc, 6000, {"a": (100, 100)})
    vtc.backlogged("b")
    served = serve(vtc, 200, {"a": (100, 100), "b": (100, 100)})
    assert served["b"] / (served["a"] + served["b"]) == pytest.approx(0.5, abs=0.02)


def test_without_the_lift_a_returning_tenant_would_monopolise():
    """The same history with the lift disabled shows what the rule prevents."""
    vtc = VirtualTokenCounter()
    vtc.backlogged("a")
    serve(vtc, 6000, {"a": (100, 100)})
    vtc.counters["b"] = 0.0
    vtc._backlog["b"] = None
    served = serve(vtc, 200, {"a": (100, 100), "b": (100, 100)})
    assert served["b"] == served.total()


def test_negative_charge_corrects_an_estimate():
    vtc = VirtualTokenCounter(output_weight=2)
    vtc.backlogged("a")
    vtc.charge("a", 10, 100)
    vtc.charge("a", 0, -90)
    assert vtc.counters["a"] == pytest.approx(10 + 2 * 10)


def test_a_flow_below_its_share_in_flight_goes_before_one_above_it_whatever_the_counters():
    """b has been served far more (its counter is higher) but has nothing in flight,
    while a holds 8: b's newcomer goes first; once they hold the same for their weights,
    the counters decide again."""
    vtc = VirtualTokenCounter(weights={"a": 1, "b": 2})
    vtc.backlogged("a")
    vtc.backlogged("b")
    vtc.charge("b", 10_000, 0)
    for _ in range(8):
        vtc.in_flight("a", 1)
    assert vtc.pick() == "b"
    for _ in range(16):
        vtc.in_flight("b", 1)
    assert vtc.pick() == "a", "4 per weight unit each: the counters decide"
    vtc.in_flight("b", 2)
    assert vtc.pick() == "a"


def test_a_returning_flow_lifted_level_with_one_above_its_share_wins_the_tie():
    """b comes back with nothing in flight and is lifted to a's counter, a holds 16: the
    tie goes to b (by insertion order it went to a, which was backlogged first)."""
    vtc = VirtualTokenCounter()
    vtc.backlogged("a")
    serve(vtc, 50, {"a": (100, 100)})
    for _ in range(16):
        vtc.in_flight("a", 1)
    vtc.backlogged("b")
    assert vtc.counters["b"] == vtc.counters["a"]
    assert vtc.pick() == "b"


def test_pick_from_serves_the_given_flows_in_the_fair_order():
    rr = RoundRobin()
    for flow in ("a", "b", "c"):
        rr.backlogged(flow)
    assert rr.pick_from(["c", "b"]) == "b"
    assert rr.pick_from([]) is None
    vtc = VirtualTokenCounter()
    for flow, held in (("a", 3), ("b", 1), ("c", 2)):
        vtc.backlogged(flow)
        vtc.in_flight(flow, held)
    assert vtc.pick_from(["a", "c"]) == "c"
