"""The routing bench (bench/routing/): its scenarios load, its plan is the seed's alone
and shares only what it means to, and its figures are computed as documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.routing import measure
from bench.routing import plan as plans
from bench.routing.__main__ import targets
from bench.routing.measure import Sent
from bench.routing.run import gateway_config
from bench.routing.scenario import RoutingScenario, Tenant, Traffic, load
from sluicegate.bench.procs import Child
from sluicegate.bench.scenario import ScenarioError
from sluicegate.config.loader import parse_settings

LIBRARY = Path(__file__).parents[2] / "bench" / "scenarios" / "routing"
SCENARIOS = sorted(LIBRARY.glob("*.yaml"))
TENANTS = [Tenant(name="a"), Tenant(name="b", weight=2)]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_routing_scenario_loads_and_starts_a_valid_gateway(path, tmp_path):
    scenario = load(path)
    assert scenario.name == f"routing-{path.stem}"
    sims = [
        Child(f"replica-{i}", None, f"http://127.0.0.1:{9000 + i}", tmp_path)  # type: ignore[arg-type]
        for i in range(scenario.replicas)
    ]
    for phase in scenario.phases:
        redis = "r:" if phase.gateways > 1 else None
        config = gateway_config(scenario, sims, phase, redis)
        env = {f"ROUTING_KEY_{i}": f"key-{i}" for i in range(len(scenario.tenants))}
        parse_settings(config, str(path), env)
    assert len({phase.name for phase in scenario.phases}) == len(scenario.phases)


def test_a_bad_scenario_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    raw = {"name": "bad", "tenants": [{"name": "a"}], "phases": [{"strategy": "random"}]}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=r"phases\[0\]\.strategy"):
        load(path)


def test_equal_replicas_keep_the_summed_speed():
    scenario = RoutingScenario(
        name="s", tenants=TENANTS, slowdown=[1, 1, 1, 3], phases=[{"strategy": "fallback"}]
    )
    equal = scenario.slowdowns(equal=True)
    assert len(set(equal)) == 1
    assert sum(1 / s for s in equal) == pytest.approx(sum(1 / s for s in scenario.slowdowns()))
    assert equal[0] == pytest.approx(1.2)


def test_the_plan_is_the_seeds_alone_and_keeps_the_rate():
    traffic = Traffic()
    one = plans.build(7, traffic, TENANTS, rate_rps=10, duration_s=200)
    assert one == plans.build(7, traffic, TENANTS, rate_rps=10, duration_s=200)
    assert one != plans.build(8, traffic, TENANTS, rate_rps=10, duration_s=200)
    assert one.requests / 200 == pytest.approx(10, rel=0.15)
    assert len(one.one_shots) / one.requests == pytest.approx(traffic.one_shot_share, abs=0.05)


def test_unshared_traffic_is_one_shot_requests_of_distinct_text():
    plan = plans.build(7, Traffic(), TENANTS, rate_rps=5, duration_s=60, shared=False)
    assert not plan.conversations
    prefixes = {o.text[:64] for o in plan.one_shots}
    assert len(prefixes) == len(plan.one_shots)


def test_prompts_share_only_the_system_prompt_and_the_conversation():
    plan = plans.build(3, Traffic(applications=2), TENANTS, rate_rps=5, duration_s=60)
    systems = set(plan.systems)
    assert len(systems) == 2
    assert all(len(s) == Traffic().system_tokens * plans.CHARS_PER_TOKEN for s in systems)
    users = [u for c in plan.conversations for u in c.users]
    assert len({u[:64] for u in users}) == len(users)


def test_a_turn_repeats_its_conversation_and_the_ceiling_counts_it():
    system, users, answers = "S" * 40, ["u1" * 10, "u2" * 10, "u3" * 10], ["a1" * 4, "a2" * 4]
    chat = plans.messages(system, users, answers)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert chat[-1]["content"] == users[2]
    assert plans.shared_chars(system, users, answers, seen=False) == 40 + 2 * 20 + 2 * 8
    assert plans.shared_chars(system, users, [], seen=False) == 0
    assert plans.shared_chars(system, users, [], seen=True) == 40


def sent(tenant="a", at=0.0, first=0.1, end=1.0, tokens=10, error=None, chars=100, shared=0):
    return Sent(tenant, "turn", at, first, end, tokens, error, chars, shared)


def test_figures_of_a_phase():
    records = [
        sent(at=0, first=0.1, end=1, chars=100, shared=50),
        sent(at=0, first=0.3, end=2, chars=100, shared=0),
        sent(at=1, first=None, end=1.5, error="http 503", chars=200, shared=150),
    ]
    assert measure.ttft(records, 50) == pytest.approx(0.2)
    assert measure.tokens_per_s(records) == pytest.approx(20 / 2)
    assert measure.ceiling(records) == pytest.approx(200 / 400)
    assert measure.max_over_mean([3, 1, 2]) == pytest.approx(1.5)
    assert measure.above_share({"r": [0, 3, 2, 5]}, target=2) == {"r": 0.5}


def test_jain_weighs_served_tokens():
    """b has twice a's weight and is served twice a's tokens: perfectly fair."""
    records = [sent("a", 0, 0.1, 10, tokens=100), sent("b", 0, 0.1, 10, tokens=200)]
    assert measure.weighted_jain(records, {"a": 1, "b": 2}, 10) == pytest.approx(1)
    records = [sent("a", 0, 0.1, 10, tokens=200), sent("b", 0, 0.1, 10, tokens=200)]
    assert measure.weighted_jain(records, {"a": 1, "b": 2}, 10) < 0.95


def figures(hit=0.3, ceiling=0.8, p50=0.2, p95=0.5, tps=100.0, jain=0.9, above=0.0):
    return {
        "hit_ratio": hit,
        "ceiling": ceiling,
        "ttft_p50_s": p50,
        "ttft_p95_s": p95,
        "tokens_per_s": tps,
        "jain_weighted": jain,
        "max_over_mean": 1.1,
        "queue_above_target": {"r": above},
    }


def test_targets_read_the_gap_closed_and_the_fleets_ratio():
    lines = targets(
        {
            "round_robin": figures(hit=0.3),
            "prefix_affinity": figures(hit=0.6),
            "prefix_affinity-2gw": figures(hit=0.57),
        }
    )
    assert "gap closed 0.60" in lines[0]
    assert any("two gateways' hit ratio 0.950" in line for line in lines)
