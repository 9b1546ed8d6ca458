"""Every problem of a config in one report: each field in a wrong shape, each variable not
set, and each reference across sections whose fields parsed; `sluicegate check` prints it
and exits 2, or says the config is valid and exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sluicegate.config import ConfigError
from tests.config.test_config import base, parse

MANY = {
    "scheduling": {
        "fairness_scope": "fleet",
        "lanes": [
            {"name": "interactive", "priority": 100, "ttft_slo": 2},
            {"name": "bulk"},
        ],
    },
    "models": [
        {
            "name": "chat",
            "deployments": [
                {
                    "name": "a",
                    "base_url": "http://127.0.0.1:9/v1",
                    "pools": ["gpu"],
                    "api_key_env": "UNSET_UPSTREAM_KEY",
                }
            ],
        }
    ],
    "tenants": [
        {"name": "t1", "keys": ["sk-raw"], "lane": "bach"},
        {"name": "t2", "keys": [{"env": "UNSET_TENANT_KEY"}], "lane": "interactiv"},
        {"name": "t3", "keys": [{"env": "ALICE_KEY"}], "lane": "interactive"},
    ],
}


def report(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(raw)
    header, *lines = str(info.value).splitlines()
    assert header == "test.yaml: invalid configuration"
    return [line.strip() for line in lines]


def test_every_field_error_and_every_reference_across_sections_is_reported_at_once():
    lines = report(MANY)
    assert lines == [
        "scheduling.lanes[0].ttft_slo: Extra inputs are not permitted; did you mean 'ttft_slo_s'?",
        "tenants[0].keys[0]: Input should be a valid dictionary or instance of KeyConfig; "
        "write it as {sha256: ...} or {env: ...}",
        "(across sections): scheduling.fairness_scope 'fleet' needs store 'redis'",
        "(across sections): deployment 'a' names unknown pools ['gpu']",
        "(across sections): tenant 't2' names unknown lane 'interactiv'; "
        "did you mean 'interactive'?",
    ], "t1 did not parse: its lane is not judged"


def test_with_the_fields_right_every_reference_and_every_variable_is_reported():
    raw = {
        **MANY,
        "scheduling": {
            "fairness_scope": "fleet",
            "lanes": [{"name": "interactive", "priority": 100}, {"name": "bulk"}],
        },
        "tenants": [{**t, "keys": [{"env": "ALICE_KEY"}]} for t in MANY["tenants"]],
    }
    raw["tenants"][1]["keys"] = [{"env": "UNSET_TENANT_KEY"}]
    assert report(raw) == [
        "(across sections): scheduling.fairness_scope 'fleet' needs store 'redis'",
        "(across sections): deployment 'a' names unknown pools ['gpu']",
        "(across sections): tenant 't1' names unknown lane 'bach'",
        "(across sections): tenant 't2' names unknown lane 'interactiv'; "
        "did you mean 'interactive'?",
    ]
    raw["store"], raw["redis"] = "redis", {"url": "redis://127.0.0.1:6379"}
    raw["pools"] = [{"name": "gpu", "max_concurrency": 4}]
    for tenant in raw["tenants"]:
        tenant["lane"] = "bulk"
    assert report(raw) == [
        "models[0].deployments[0].api_key_env (deployment 'a'): "
        "environment variable UNSET_UPSTREAM_KEY is not set",
        "tenants[1].keys[0].env: environment variable UNSET_TENANT_KEY is not set",
        "tenants[2].keys[0]: the same key is already given to another tenant",
    ]


def test_a_variable_not_set_is_reported_once_with_its_field():
    raw = base()
    raw["models"][0]["deployments"][0]["base_url"] = "${NOT_SET_URL}"
    raw["server"] = {"port": "${NOT_SET_PORT}"}
    assert report(raw) == [
        "models[0].deployments[0].base_url: environment variable NOT_SET_URL is not set",
        "server.port: environment variable NOT_SET_PORT is not set",
    ]


def check(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=60,
        check=False,
    )


def test_check_reports_every_problem_and_exits_2_or_says_valid(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(MANY))
    done = check(bad, {"ALICE_KEY": "sk-a"})
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == f"sluicegate: {bad}: invalid configuration"
    assert len(lines) == 6
    assert "Traceback" not in done.stderr
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(base()))
    done = check(good, {"ALICE_KEY": "sk-a", "SIM_URL": "http://127.0.0.1:9/v1"})
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"{good}: valid: 1 models, 1 tenants, lanes default\n"


def test_check_reports_a_checker_setting_only_its_library_can_judge(tmp_path: Path):
    raw = base()
    raw["guardrails"] = {
        "checks": [{"name": "g", "checker": {"kind": "pii", "regions": ["XX"]},
                    "action": "mask", "placement": "pre_call"}]
    }  # fmt: skip
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    done = check(bad, {"ALICE_KEY": "sk-a", "SIM_URL": "http://127.0.0.1:9/v1"})
    assert done.returncode == 2
    assert "guardrails.checks[0].checker (guardrail 'g', pii): phone regions ['XX']" in done.stderr
    assert "Traceback" not in done.stderr
