"""Scenario files: every library scenario loads; a bad one is refused naming the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluicegate.bench.arrivals import Burst, Poisson
from sluicegate.bench.dists import Fixed
from sluicegate.bench.procs import SIM_URL_ENV
from sluicegate.bench.scenario import Flow, ScenarioError, compressed, load, rate_scaled
from sluicegate.bench.traffic import flow_keys
from sluicegate.config.loader import parse_settings

ROOT = Path(__file__).parents[2]
LIBRARY = ROOT / "bench" / "scenarios"
SCENARIOS = sorted(LIBRARY.glob("*.yaml"))
MINIMAL = {
    "name": "minimal",
    "duration_s": 10,
    "gateway": {"tenants": [{"name": "a", "keys": [{"env": "KEY_A"}]}]},
    "tenants": [{"name": "a", "key_env": "KEY_A"}],
    "lanes": {"chat": {"ttft_s": 1}},
    "flows": [
        {"tenant": "a", "lane": "chat", "arrival": {"kind": "poisson", "rate": 4}},
        {"tenant": "a", "lane": "chat", "arrival": {"kind": "burst", "count": 9, "at_s": [4]}},
    ],
}


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def changed(path: str, value: object) -> dict:
    """MINIMAL with the value at a dotted path (list indexes as numbers) replaced."""
    raw = yaml.safe_load(yaml.safe_dump(MINIMAL))
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = raw
    for part in parents:
        node = node[part]
    node[last] = value
    return raw


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_library_scenario_loads(path):
    scenario = load(path)
    assert scenario.name == path.stem
    assert scenario.gateway is not None


def variables(node: Any) -> set[str]:
    """The environment variables a gateway config reads: `${NAME}` and keys' `env`."""
    if isinstance(node, dict):
        named = {v for k, v in node.items() if k in ("env", "api_key_env") and isinstance(v, str)}
        return named.union(*(variables(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(variables(v) for v in node))
    return set(re.findall(r"\$\{(\w+)\}", node)) if isinstance(node, str) else set()


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_library_scenario_starts_a_valid_gateway(path):
    """The gateway config is only a mapping to the scenario schema: the gateway's own
    loader must accept it too, or the run fails at start."""
    gateway = load(path).gateway
    env = {name: f"value-of-{name}" for name in variables(gateway)}
    parse_settings(gateway, str(path), {**env, SIM_URL_ENV: "http://127.0.0.1:8001"})


def test_the_small_slow_backend_runs_the_documented_lanes():
    """The `scheduling` block of docs/configuration.md's complete example as a user
    would copy it, less its `fairness_scope: local`, the default that the scenarios
    leave out."""
    blocks = (ROOT / "docs" / "configuration.md").read_text().split("```yaml\n")[1:]
    example = next(block.split("```", 1)[0] for block in blocks if "\nscheduling:" in block)
    readme = yaml.safe_load(example)["scheduling"]
    assert readme.pop("fairness_scope") == "local"
    for name in ("small-slow-backend", "small-slow-backend-idle"):
        gateway = load(LIBRARY / f"{name}.yaml").gateway
        assert gateway is not None
        assert gateway["scheduling"] == readme


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("flows.0.arrival.rate", 0, "flows[0].arrival.poisson.rate: Input should be greater"),
        ("flows.0.lane", "batch", "flows[0].lane: unknown lane 'batch'"),
        ("flows.1.tenant", "z", "flows[1].tenant: unknown tenant 'z'"),
        ("flows.0.retry", {"policy": "sometimes"}, "flows[0].retry: Input tag 'sometimes'"),
        ("flows.0.output_tokens", {"dist": "uniform", "low": 9, "high": 1}, "high must be >="),
        ("flows.0.arrival.rate_per_s", 3, "flows[0].arrival.poisson.rate_per_s: Extra inputs"),
        ("lanes.chat.ttft_s", -1, "lanes.chat.ttft_s: Input should be greater than 0"),
        ("policy", "maybe", "policy: Input should be 'on' or 'off'"),
        ("tenants.0.key_env", "OTHER", "tenants[0].key_env: OTHER is not a key env"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_field(tmp_path, path, value, named):
    with pytest.raises(ScenarioError) as refused:
        load(write(tmp_path, changed(path, value)))
    assert named in str(refused.value)
    assert str(refused.value).startswith(f"{tmp_path / 'scenario.yaml'}: invalid scenario")


def test_yaml_on_and_off_are_policies(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(MINIMAL) + "policy: off\n")
    assert load(path).policy == "off"


def test_a_number_is_a_fixed_length(tmp_path):
    scenario = load(write(tmp_path, changed("flows.0.prompt_tokens", 300)))
    assert scenario.flows[0].prompt_tokens == Fixed(value=300)


def test_quick_squeezes_the_timeline_and_keeps_the_rates(tmp_path):
    scenario = compressed(load(write(tmp_path, MINIMAL)), duration_s=2.5, drain_s=1.0)
    poisson, burst = (flow.arrival for flow in scenario.flows)
    assert scenario.duration_s == 2.5
    assert scenario.drain_s == 1.0
    assert isinstance(poisson, Poisson)
    assert poisson.rate == 4
    assert isinstance(burst, Burst)
    assert (burst.count, burst.at_s) == (3, [1.0])


def test_rate_scale_multiplies_poisson_rates_only(tmp_path):
    scenario = rate_scaled(load(write(tmp_path, MINIMAL)), 0.5)
    poisson, burst = (flow.arrival for flow in scenario.flows)
    assert isinstance(poisson, Poisson)
    assert poisson.rate == 2
    assert isinstance(burst, Burst)
    assert burst.count == 9


@pytest.mark.parametrize("name", ["noisy-neighbour", "small-slow-backend"])
def test_an_idle_baseline_replays_the_same_traffic_as_its_busy_scenario(name):
    busy = load(LIBRARY / f"{name}.yaml")
    idle = load(LIBRARY / f"{name}-idle.yaml")
    assert [f.tenant for f in busy.flows] == ["a", "b", "c"]
    assert busy.flows[1:] == idle.flows
    assert flow_keys(busy.flows)[1:] == flow_keys(idle.flows)
    assert (busy.seed, busy.sim) == (idle.seed, idle.sim)


def test_flows_are_keyed_by_tenant_and_rank():
    two_of_a = [Flow.model_validate(flow) for flow in MINIMAL["flows"]]
    assert flow_keys(two_of_a) == [("a", 0), ("a", 1)]
