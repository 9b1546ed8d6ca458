"""deploy/prometheus passes promtool: the rules and the scrape config check, and every
alert has a unit test of its own that passes (`promtool test rules`)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from tests.deploy.names import DEPLOY, RULE_TESTS, RULES, alerts


@pytest.fixture(scope="module")
def promtool() -> str:
    """Debian's `prometheus` package ships it (`.ci/run` installs it when missing)."""
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool is not installed (apt-get install -y prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI=true requires it")
        pytest.skip(reason)
    return found


def run(promtool: str, *args: str) -> str:
    done = subprocess.run(
        [promtool, *args],
        cwd=DEPLOY / "prometheus",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rules_check(promtool):
    assert f"SUCCESS: {len(alerts())} rules found" in run(promtool, "check", "rules", RULES.name)


def test_the_scrape_config_checks_with_its_rules(promtool):
    run(promtool, "check", "config", "prometheus.yml")


def test_every_alerts_unit_tests_pass(promtool):
    run(promtool, "test", "rules", RULE_TESTS.name)


def test_every_alert_has_a_test_of_its_own():
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert set(alerts()) <= tested, set(alerts()) - tested
