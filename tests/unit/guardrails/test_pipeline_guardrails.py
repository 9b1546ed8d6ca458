"""Guardrails in the pipeline, with scripted providers and a fake clock: each placement
and failure mode, what reaches the provider, and what a refusal costs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sluicegate.core.errors import GatewayError
from tests.unit.test_pipeline import config, driven, running

NEVER = {"kind": "plugin", "path": "tests.unit.guardrails.plugins:Never"}


def patterns(expression: str) -> dict:
    return {
        "kind": "plugin",
        "path": "sluicegate.guardrails.patterns:Patterns",
        "options": {"patterns": {"secret": expression}},
    }


def guarded(*checks: dict) -> dict:
    raw = config({"name": "a"})
    raw["guardrails"] = {
        "checks": list(checks),
        "apply": [{"guardrails": [c["name"] for c in checks]}],
    }
    return raw


def check(name: str, checker: dict, action: str, placement: str, **extra: Any) -> dict:
    return {"name": name, "checker": checker, "action": action, "placement": placement, **extra}


async def test_a_pre_call_block_sends_nothing_and_takes_nothing() -> None:
    raw = guarded(check("keys", patterns("sk-[a-z]{8}"), "block", "pre_call"))
    async with running(raw, {}) as h:
        with pytest.raises(GatewayError) as caught:
            await h.ask(h.inbound(messages=[{"role": "user", "content": "sk-abcdefgh"}]))
        assert (caught.value.status, caught.value.code) == (400, "guardrail_blocked")
        assert h.providers["a"].bodies == []
        counters = h.runtime.pools["a"].counters
        assert (counters.active, counters.tokens_used) == (0, 0)


async def test_a_pre_call_mask_rewrites_what_the_provider_gets() -> None:
    raw = guarded(check("keys", patterns("sk-[a-z]{8}"), "mask", "pre_call"))
    async with running(raw, {}) as h:
        messages = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "key sk-abcdefgh"}]},
        ]
        inbound = h.inbound(messages=messages)
        await h.ask(inbound)
        (sent,) = h.providers["a"].bodies
        assert sent["messages"][0]["content"] == "be brief"
        assert sent["messages"][1]["content"][0]["text"] == "key [SECRET]"
        assert messages[1]["content"][0]["text"] == "key sk-abcdefgh", "the caller's is kept"


@pytest.mark.parametrize(
    ("action", "on_failure", "refused"),
    [("block", None, True), ("audit", None, False), ("block", "fail_open", False)],
)
async def test_a_check_that_never_answers_decides_at_its_budget(
    action: str, on_failure: str | None, refused: bool
) -> None:
    extra = {"budget_s": 0.25} | ({"on_failure": on_failure} if on_failure else {})
    raw = guarded(check("stuck", NEVER, action, "pre_call", **extra))
    async with running(raw, {}) as h:
        started = h.clock.now()
        task = asyncio.ensure_future(h.ask(h.inbound()))
        if refused:
            with pytest.raises(GatewayError) as caught:
                await driven(h.clock, task, step_s=0.0625)
            assert (caught.value.status, caught.value.code) == (503, "guardrail_unavailable")
            assert h.providers["a"].bodies == []
        else:
            assert await driven(h.clock, task, step_s=0.0625)
            assert len(h.providers["a"].bodies) == 1
        assert h.clock.now() - started == pytest.approx(0.25)


async def test_a_parallel_check_runs_beside_the_attempt_and_holds_its_answer() -> None:
    raw = guarded(check("stuck", NEVER, "block", "parallel", budget_s=0.25))
    async with running(raw, {}) as h:
        task = asyncio.ensure_future(h.ask(h.inbound()))
        with pytest.raises(GatewayError) as caught:
            await driven(h.clock, task, step_s=0.0625)
        assert caught.value.code == "guardrail_unavailable"
        assert len(h.providers["a"].bodies) == 1, "the model attempt started at once"
        assert h.runtime.pools["a"].counters.active == 0


async def test_a_post_call_block_is_settled_at_the_usage_the_provider_billed() -> None:
    raw = guarded(check("hi", patterns(r"\bhi\b"), "block", "post_call"))
    async with running(raw, {}) as h:
        with pytest.raises(GatewayError) as caught:
            await h.ask(h.inbound())
        assert caught.value.code == "guardrail_blocked"
        assert "the answer" in caught.value.message
        assert h.runtime.pools["a"].counters.tokens_used == 7


async def test_a_cached_decision_skips_the_checker() -> None:
    counting = {"kind": "plugin", "path": "tests.unit.guardrails.plugins:Counting"}
    raw = guarded(check("counted", counting, "block", "pre_call"))
    async with running(raw, {}) as h:
        for _ in range(3):
            await h.ask(h.inbound())
        guardrails = h.runtime.pipeline._guardrails
        assert guardrails is not None
        (guardrail,) = guardrails.chosen("chat", "default", "a").pre_call
        assert guardrail._checker.calls == 1  # type: ignore[attr-defined]
        await h.ask(h.inbound(messages=[{"role": "user", "content": "other"}]))
        assert guardrail._checker.calls == 2  # type: ignore[attr-defined]
