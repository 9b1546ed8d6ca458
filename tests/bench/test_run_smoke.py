"""`sluicegate bench run SCENARIO --quick` runs a tiny scenario end to end and writes it all.

Speed is a benchmark figure, not a test: nothing here checks a timing target.
"""

from __future__ import annotations

import json

from tests.bench.conftest import is_number, run_bench

SCENARIO = """
name: tiny
description: two tenants, two lanes, every arrival kind, a concurrency limit, two events
duration_s: 3
drain_s: 10
capacity_rps: 20
gateway:
  scheduling:
    lanes: [{name: interactive, priority: 10}, {name: batch}]
  models:
    - name: sim-model
      deployments: [{name: sim, base_url: "${SLUICEGATE_SIM_URL}/v1"}]
  tenants:
    - {name: a, keys: [{env: TINY_KEY_A}], limits: {max_concurrency: 1}}
    - {name: b, keys: [{env: TINY_KEY_B}]}
tenants:
  - {name: a, key_env: TINY_KEY_A}
  - {name: b, key_env: TINY_KEY_B}
lanes:
  interactive: {ttft_s: 1, tpot_s: 0.1}
  batch: {e2e_s: 30}
flows:
  - tenant: a
    lane: batch
    arrival: {kind: burst, count: 6, at_s: [0.5]}
    stream: false
    output_tokens: {dist: uniform, low: 8, high: 24}
    retry: {policy: backoff, max_attempts: 3, base_s: 0.05, cap_s: 0.2}
  - tenant: b
    lane: interactive
    arrival: {kind: poisson, rate: 10}
    prompt_tokens: {dist: lognormal, median: 200, sigma: 0.5, max: 2000}
    output_tokens: 16
  - tenant: b
    lane: interactive
    arrival: {kind: closed, clients: 2, think_s: 0.1}
    output_tokens: 8
    retry: {policy: immediate, max_attempts: 2}
events:
  - {at_s: 1, faults: {slowdown: 2}}
  - {at_s: 2, faults: {slowdown: 1}}
"""
SECTIONS = (
    "scenario",
    "definitions",
    "load",
    "statuses",
    "latency",
    "refusals",
    "fairness",
    "series",
    "events",
    "notes",
    "files",
    "figures",
)


def numbers(value: object) -> list[object]:
    """Every leaf of a JSON document that is not a number (None stands for NaN)."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in numbers(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in numbers(item)]
    return [] if value is None or is_number(value) else [value]


def test_quick_run_writes_every_section_and_file(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    done = run_bench("run", str(scenario), "--quick", "--out", str(out))
    assert "Load, own gateway, policy on" in done.stdout
    doc = json.loads((out / "summary.json").read_text())
    assert set(SECTIONS) <= set(doc)
    for section in ("load", "statuses", "latency", "refusals", "fairness"):
        assert numbers(doc[section]) == [], section
    assert numbers({k: v for k, v in doc["series"].items() if k != "metrics"}) == []
    load, statuses = doc["load"], doc["statuses"]
    assert load["requests"] > 0
    assert sum(statuses["requests"].values()) == load["requests"]
    assert sum(statuses["attempts"].values()) == load["attempts"] >= load["requests"]
    assert statuses["attempts"].get("200 ok", 0) > 0
    assert statuses["attempts"].get("429 tenant_concurrency_limited", 0) > 0
    assert [event["answer"] for event in doc["events"]] == ["200", "200"]
    accounted = doc["slo_accounting"]
    assert set(accounted) == {"interactive", "batch"}
    assert sum(lane["gateway_met"] for lane in accounted.values()) > 0
    assert {lane["agrees"] for lane in accounted.values()} == {None}, "clients retried"
    for name in doc["files"].values():
        assert (out / name).stat().st_size > 0, name
    assert "<svg" in (out / doc["files"]["html"]).read_text()
    lines = (out / doc["files"]["requests"]).read_text().splitlines()
    assert len(lines) == load["requests"]
