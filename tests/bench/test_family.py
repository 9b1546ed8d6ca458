"""The traffic family's generator: seeded, covering every range, never narrowing the lanes."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest
import yaml

from bench.family import capacity, run
from bench.family import variants as family
from bench.family.__main__ import main as family_main
from sluicegate.bench import client
from sluicegate.bench.arrivals import Burst, Closed, Poisson
from sluicegate.bench.scenario import load

SEEDS = range(400)


@pytest.fixture(scope="module")
def variants() -> list[family.Variant]:
    return [family.generate(seed, index) for seed in SEEDS for index in range(2)]


def test_a_seed_and_an_index_always_give_the_same_variant() -> None:
    assert family.generate(7, 3) == family.generate(7, 3)
    assert family.generate(7, 3) != family.generate(7, 4)
    assert family.generate(7, 3) != family.generate(8, 3)


def test_variants_stay_inside_every_range_and_reach_both_ends(
    variants: list[family.Variant],
) -> None:
    overloads = [v.overload for v in variants]
    assert 1.5 <= min(overloads) < 1.6
    assert 3.9 < max(overloads) <= 4.0
    counts = {len(v.tenants) for v in variants}
    assert counts == set(range(2, 11))
    ratios = [v.caller_ratio for v in variants]
    assert min(ratios) >= 1.0 - 1e-9
    assert max(ratios) <= 10.0 + 1e-9
    assert min(ratios) < 1.2
    assert max(ratios) > 9.5
    batches = [v.batch for v in variants]
    assert min(batches) == 8
    assert max(batches) == 64
    slowdowns = [v.slowdown for v in variants if v.slowdown is not None]
    assert 0.3 < len(slowdowns) / len(variants) < 0.7
    assert 1.5 <= min(slowdowns) < 1.6
    assert 2.9 < max(slowdowns) <= 3.0
    tenants = [t for v in variants for t in v.tenants]
    assert {t.arrival for t in tenants} == {"poisson", "burst", "closed"}
    assert {v.retry for v in variants} == {"none", "immediate", "backoff"}
    prompts = [t.prompt() for t in tenants]
    outputs = [t.output() for t in tenants]
    assert min(p.low for p in prompts) == 64
    assert max(p.high for p in prompts) == 4000
    assert min(o.low for o in outputs) == 16
    assert max(o.high for o in outputs) == 1000


def test_shares_sum_to_one_with_the_stated_caller_ratio(variants: list[family.Variant]) -> None:
    for variant in variants:
        assert math.isclose(sum(t.share for t in variant.tenants), 1.0)
        assert 1.0 <= variant.caller_ratio <= 10.0 + 1e-9


def test_every_variant_runs_the_readme_lanes_unchanged(variants: list[family.Variant]) -> None:
    lanes = {yaml.safe_dump(family.gateway_config(v)["scheduling"]) for v in variants}
    assert len(lanes) == 1
    scheduling = family.gateway_config(variants[0])["scheduling"]
    assert scheduling["fairness"] == "vtc"
    interactive, batch = scheduling["lanes"]
    assert (interactive["ttft_slo_s"], interactive["max_queue_age_s"]) == (2, 10)
    assert batch["priority"] < interactive["priority"]
    for variant in variants[:50]:
        config = family.gateway_config(variant)
        assert config["pools"] == [{"name": "sim", "max_concurrency": variant.batch}]
        (deployment,) = config["models"][0]["deployments"]
        assert deployment["metrics"]["max_num_seqs"] == variant.batch
        assert deployment["resumable"] is True


def test_the_scenario_offers_overload_times_capacity_and_slows_down_on_time() -> None:
    variant = next(
        v
        for v in (family.generate(seed, 0) for seed in SEEDS)
        if v.slowdown and {t.arrival for t in v.tenants} == {"poisson", "burst", "closed"}
    )
    capacity, service_s, duration_s = 10.0, 2.0, 30.0
    scenario = family.scenario(variant, capacity, service_s, duration_s, 20.0)
    offered = 0.0
    for tenant, flow in zip(variant.tenants, scenario.flows, strict=True):
        rate = variant.overload * capacity * tenant.share
        arrival = flow.arrival
        if isinstance(arrival, Poisson):
            offered += arrival.rate
            assert math.isclose(arrival.rate, rate)
        elif isinstance(arrival, Burst):
            every = arrival.at_s[1] - arrival.at_s[0]
            assert arrival.count == max(1, round(rate * every))
            offered += arrival.count / every
        else:
            assert isinstance(arrival, Closed)
            assert arrival.clients == max(1, round(rate * (tenant.think_s + service_s)))
        assert flow.timeout_s >= family.TIMEOUT_S
    assert offered > 0
    (event,) = scenario.events
    assert event.at_s == pytest.approx(variant.slowdown_at * duration_s)
    assert event.faults == {"slowdown": variant.slowdown}


def test_a_variant_prints_as_a_scenario_file_that_loads_alone(tmp_path: Path) -> None:
    variant = family.generate(3, 1)
    scenario = family.scenario(variant, 5.0, 1.0, 30.0, 20.0)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
    assert load(path) == scenario


def test_the_probe_keeps_each_tenants_shape_at_its_share_of_the_rate() -> None:
    variant = family.generate(5, 0)
    probe = family.probe(variant, 12.0, 10.0, 5.0)
    rates = [flow.arrival.rate for flow in probe.flows if isinstance(flow.arrival, Poisson)]
    assert len(rates) == len(variant.tenants)
    assert sum(rates) == pytest.approx(12.0)
    assert [f.prompt_tokens for f in probe.flows] == [t.prompt() for t in variant.tenants]
    assert probe.events == []


def test_long_answers_get_a_timeout_long_enough_to_finish() -> None:
    long = [
        v
        for v in (family.generate(seed, 0) for seed in SEEDS)
        if v.batch == 64 and max(t.output().high for t in v.tenants) == 1000
    ]
    assert long
    for variant in long:
        # A full batch of 64 steps about 46 ms: 1,000 tokens take 46 s, far past 15 s.
        assert variant.timeout_s() > 1000 * 0.046 * (variant.slowdown or 1.0)


def test_a_capacity_read_back_from_its_json_is_the_capacity_written():
    probes = (
        capacity.Probe(2.0, 30, 1.0, 0.4, 3.1),
        capacity.Probe(4.0, 50, 0.9, 0.4, 5.0),
    )
    found = capacity.Capacity(3.5, probes)
    assert run.capacity_from_json(run.capacity_json(found)) == found


def test_a_gateway_setting_changed_by_a_dotted_key_leaves_the_rest():
    config = {"scheduling": {"fairness": "vtc", "reserve": 0.25}, "pools": [1]}
    path, value = run.setting("scheduling.reserve=0")
    changed = run.with_setting(config, path, value)
    assert changed == {"scheduling": {"fairness": "vtc", "reserve": 0}, "pools": [1]}
    assert config["scheduling"]["reserve"] == 0.25
    with pytest.raises(ValueError, match="KEY=VALUE"):
        run.setting("scheduling.reserve")


def test_the_simulator_caches_prefixes_of_prompts_that_differ() -> None:
    """vLLM's default prefix caching, on prompts each of their own: only a request's
    own retries and the continuation of its answer can find blocks cached."""
    variant = family.generate(1, 5)
    assert variant.sim()["prefix_caching"] is True
    assert variant.engine().prefix_caching
    asked = dict(prompt_tokens=300, output_tokens=8, stream=True, timeout_s=15.0)
    first, second = (
        client.prepare("http://127.0.0.1:1/v1", "m", "k", "interactive", **asked) for _ in range(2)
    )
    texts = [orjson.loads(r.body)["messages"][0]["content"] for r in (first, second)]
    assert all(len(text) == 300 * client.CHARS_PER_TOKEN for text in texts)
    assert texts[0][:64] != texts[1][:64]


def test_a_choice_of_runs_is_listed_once_each(capsys):
    with pytest.raises(SystemExit) as ended:
        family_main(["--help"])
    assert ended.value.code == 0
    shown = capsys.readouterr().out
    assert "{on,off,on,off}" not in shown
    assert "on,off|on|off" in shown
