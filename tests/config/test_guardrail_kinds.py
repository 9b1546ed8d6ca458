"""The built-in checker kinds in config: one good and one bad setting per kind, each
error naming the field; settings the schema cannot judge (phone regions) refused when
the guardrails are built; a guard model's references and its pools."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from sluicegate.config.schema import InjectionFamily, PiiKind
from sluicegate.guardrails.build import Guardrails
from sluicegate.guardrails.injection import FAMILIES
from sluicegate.guardrails.pii_kinds import KINDS
from sluicegate.guardrails.plugin import PluginError
from tests.config.test_config import base, error_of, parse
from tests.support.clock import FakeClock


def guarded(checker: dict[str, Any], placement: str = "pre_call", **config: Any) -> dict:
    raw = base() | config
    raw["guardrails"] = {
        "checks": [{"name": "g", "checker": checker, "action": "block", "placement": placement}]
    }
    return raw


def guard_model(**settings: Any) -> dict:
    return {"kind": "guard_model", "model": "chat", "lane": "default", "tenant": "alice"} | settings


GOOD = [
    {"kind": "pii", "kinds": ["email", "card"], "regions": ["US", "DE"]},
    {"kind": "pii"},
    {"kind": "banned_terms", "terms": ["foo", "bar baz"], "whole_words": False},
    {"kind": "injection", "families": ["override"]},
    {"kind": "injection"},
    {"kind": "size", "max_chars": 1000},
    {"kind": "moderation", "url": "http://127.0.0.1:9/v1/moderations", "api_key": "k",
     "block": ["violence"], "thresholds": {"hate": 0.5}, "timeout_s": 2},
    guard_model(block=["S1", "hate"]),
]  # fmt: skip


@pytest.mark.parametrize("checker", GOOD, ids=lambda c: c["kind"])
def test_each_kind_parses_and_builds(checker: dict) -> None:
    settings = parse(guarded(checker))
    spec = settings.guardrails.guardrails["g"]
    assert spec.checker.kind == checker["kind"]

    def ask_for(settings: Any) -> Any:
        assert (settings["model"], settings["lane"], settings["tenant"]) == (
            "chat", "default", "alice",
        )  # fmt: skip
        return lambda messages: None

    built = Guardrails(settings.guardrails, FakeClock(), ask_for=ask_for)
    assert built.chosen("chat", "default", "alice").pre_call == ()


BAD = [
    ({"kind": "pii", "kinds": ["passport"]}, "guardrails.checks[0].checker.kinds[0]"),
    ({"kind": "pii", "regions": ["usa"]}, "guardrails.checks[0].checker.regions[0]"),
    ({"kind": "banned_terms", "terms": []}, "guardrails.checks[0].checker.terms"),
    ({"kind": "banned_terms", "terms": ["x" * 201]}, "guardrails.checks[0].checker.terms[0]"),
    ({"kind": "injection", "families": ["jailbreak"]}, "guardrails.checks[0].checker.families[0]"),
    ({"kind": "size", "max_chars": 0}, "guardrails.checks[0].checker.max_chars"),
    ({"kind": "size"}, "needs max_chars, max_lines or both"),
    ({"kind": "moderation"}, "guardrails.checks[0].checker.url"),
    ({"kind": "moderation", "url": "http://h/m", "thresholds": {"hate": 2}},
     "guardrails.checks[0].checker.thresholds.hate"),
    ({"kind": "moderation", "url": "http://h/m", "headers": {}},
     "guardrails.checks[0].checker.headers"),
    ({"kind": "guard_model", "model": "chat"}, "guardrails.checks[0].checker.lane"),
    (guard_model(max_tokens=0), "guardrails.checks[0].checker.max_tokens"),
    (guard_model(model="chatt"), "checker.model 'chatt' is not a model; did you mean 'chat'"),
    (guard_model(lane="fast"), "checker.lane 'fast' is not a lane"),
    (guard_model(tenant="bob"), "checker.tenant 'bob' is not a tenant"),
    ({"kind": "regex"}, "guardrails.checks[0].checker"),
]  # fmt: skip


@pytest.mark.parametrize(("checker", "expected"), BAD, ids=lambda c: str(c)[:40])
def test_each_bad_setting_is_named(checker: dict, expected: str) -> None:
    assert expected in error_of(guarded(checker))


def test_an_unknown_key_of_a_kind_gets_a_did_you_mean() -> None:
    message = error_of(guarded({"kind": "banned_terms", "term": ["x"]}))
    assert "guardrails.checks[0].checker.term" in message
    assert "did you mean 'terms'?" in message


def test_a_phone_region_phonenumbers_does_not_know_is_refused_when_built() -> None:
    settings = parse(guarded({"kind": "pii", "regions": ["XX"]}))
    named = r"guardrails\.checks\[0\]\.checker \(guardrail 'g', pii\): phone regions \['XX'\]"
    with pytest.raises(PluginError, match=named):
        Guardrails(settings.guardrails, FakeClock())


def test_a_fallback_that_cannot_be_built_is_named_as_the_fallback() -> None:
    raw = guarded({"kind": "size", "max_chars": 10})
    raw["guardrails"]["checks"][0]["fallback"] = {"kind": "pii", "regions": ["XX"]}
    settings = parse(raw)
    with pytest.raises(PluginError, match=r"guardrails\.checks\[0\]\.fallback \(guardrail 'g'"):
        Guardrails(settings.guardrails, FakeClock())


def test_a_guard_model_tenant_must_be_allowed_its_model() -> None:
    raw = guarded(guard_model())
    raw["tenants"][0]["models"] = ["other"]
    raw["models"].append({**raw["models"][0], "name": "other"})
    raw["models"][1]["deployments"] = [{**raw["models"][0]["deployments"][0], "name": "sim-b"}]
    assert "tenant 'alice' may not use the model 'chat'" in error_of(raw)


def two_models(guard_pools: list[str]) -> dict[str, Any]:
    sim = {"base_url": "${SIM_URL}", "model": "sim-model", "pools": ["shared"]}
    return {
        "pools": [{"name": "shared", "max_concurrency": 4}, {"name": "own", "max_concurrency": 1}],
        "models": [
            {"name": "chat", "deployments": [{**sim, "name": "sim-a"}]},
            {"name": "guard", "deployments": [{**sim, "name": "sim-g", "pools": guard_pools}]},
        ],
    }


@pytest.mark.parametrize("placement", ["parallel", "post_call"])
def test_a_guard_model_beside_or_after_the_call_may_share_no_pool_with_it(placement: str) -> None:
    raw = guarded(guard_model(model="guard"), placement, **two_models(["shared"]))
    assert f"a {placement} guard model" in error_of(raw)
    assert "shared: ['shared']" in error_of(raw)
    parse(guarded(guard_model(model="guard"), placement, **two_models(["own"])))


def test_a_pre_call_guard_model_may_share_its_pool() -> None:
    parse(guarded(guard_model(model="guard"), "pre_call", **two_models(["shared"])))


def test_the_schema_knows_every_pii_kind_and_injection_family() -> None:
    assert set(get_args(PiiKind)) == set(KINDS)
    assert set(get_args(InjectionFamily)) == set(FAMILIES)


def test_a_guard_model_tenant_must_be_allowed_its_lane() -> None:
    lanes = [{"name": "default"}, {"name": "guard", "priority": 5}]
    raw = guarded(guard_model(lane="guard"), scheduling={"lanes": lanes})
    assert "tenant 'alice' may not ask for the lane 'guard'" in error_of(raw)
    raw["tenants"][0]["lanes"] = ["guard"]
    parse(raw)


def test_a_guard_model_lane_may_not_be_the_one_overload_pauses_first() -> None:
    lanes = [{"name": "default", "priority": 5}, {"name": "batch"}]
    raw = guarded(guard_model(lane="batch"), scheduling={"lanes": lanes})
    assert "checker.lane 'batch' is the lowest-priority lane" in error_of(raw)
    parse(guarded(guard_model(lane="default"), scheduling={"lanes": lanes}))
