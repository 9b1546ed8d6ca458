"""The `guardrails:` section: named checks, where they apply, and one bad config per error."""

from __future__ import annotations

import pytest

from sluicegate.core.guarding import Action, OnFailure, Placement
from tests.config.test_config import base, error_of, parse


def with_guardrails(**section) -> dict:
    raw = base()
    raw["guardrails"] = section
    return raw


def check(name: str, **extra) -> dict:
    return {
        "name": name,
        "checker": {"kind": "http", "url": "http://127.0.0.1:9/check"},
        "action": "block",
        "placement": "pre_call",
        **extra,
    }


def test_guardrails_parse_with_failure_defaults_from_the_action() -> None:
    raw = with_guardrails(
        checks=[
            check("pii", action="mask", budget_s=0.2),
            check("audit", action="audit", placement="post_call", window=64),
            check(
                "plug",
                checker={"kind": "plugin", "path": "my.module:Check", "options": {"x": 1}},
                on_failure="fail_open",
                fallback={"kind": "http", "url": "http://127.0.0.1:9/b", "budget_s": 0.1},
            ),
        ],
        apply=[
            {"guardrails": ["pii", "audit"], "routes": ["chat"]},
            {"guardrails": ["plug", "pii"], "tenants": ["alice"], "cut_streams": True},
        ],
    )
    policy = parse(raw).guardrails
    pii, audit, plug = (policy.guardrails[n] for n in ("pii", "audit", "plug"))
    assert (pii.action, pii.on_failure, pii.checker.budget_s) == (
        Action.MASK, OnFailure.CLOSED, 0.2,
    )  # fmt: skip
    assert (audit.on_failure, audit.placement, audit.window) == (
        OnFailure.OPEN, Placement.POST_CALL, 64,
    )  # fmt: skip
    assert plug.on_failure is OnFailure.OPEN
    assert plug.checker.settings["path"] == "my.module:Check"
    assert plug.fallback is not None
    assert plug.fallback.budget_s == 0.1
    chosen = policy.select("chat", "default", "alice")
    assert [s.name for s in chosen.pre_call] == ["pii", "plug"]
    assert [s.name for s in chosen.post_call] == ["audit"]
    assert chosen.cut_streams
    assert policy.select("embeddings", "default", "bob").any is False
    assert policy.version


def test_the_version_follows_the_section() -> None:
    one = parse(with_guardrails(checks=[check("a")])).guardrails.version
    two = parse(with_guardrails(checks=[check("a", budget_s=0.3)])).guardrails.version
    assert one != two


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"apply": [{"guardrails": ["nope"]}]}, "unknown guardrail 'nope'"),
        ({"checks": [check("a"), check("a")]}, "duplicate name 'a'"),
        ({"checks": [check("a", placement="parallel", action="mask")]}, "cannot mask"),
        ({"checks": [check("a", checker={"kind": "http"})]}, "needs a url"),
        ({"checks": [check("a", checker={"kind": "plugin"})]}, "needs a path"),
        ({"checks": [check("a", checker={"kind": "plugin", "path": "no"})]}, "checker.path"),
        ({"checks": [check("a", budget_s=0)]}, "guardrails.checks[0].budget_s"),
        ({"checks": [check("a", window=0)]}, "guardrails.checks[0].window"),
        ({"checks": [check("a", action="drop")]}, "guardrails.checks[0].action"),
        ({"checks": [check("a")], "apply": [{"guardrails": ["a"], "lanes": ["x"]}]}, "lane 'x'"),
        (
            {"checks": [check("a")], "apply": [{"guardrails": ["a"], "tenants": ["alicee"]}]},
            "did you mean 'alice'",
        ),
    ],
)
def test_each_bad_guardrail_field_is_named(section: dict, expected: str) -> None:
    assert expected in error_of(with_guardrails(**section))
