"""A guard model's call through the pipeline, on a fake clock: with the guard pool full,
the checked request ends at the guardrail's budget by its failure mode, and the guard
call's place in the queue is given up, taking no permit."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import OverloadState
from tests.unit.test_pipeline import config, driven, running

BUDGET_S = 0.25


def with_guard_model(queue_size: int) -> dict:
    raw = config(
        {"name": "a"}, scheduling={"lanes": [{"name": "default", "queue_size": queue_size}]}
    )
    raw["pools"].append({"name": "g", "max_concurrency": 1})
    deployment = {"name": "g", "base_url": "http://127.0.0.1:9/v1", "model": "m", "pools": ["g"]}
    raw["models"].append({"name": "guard", "deployments": [deployment]})
    key = hashlib.sha256(b"sk-guard").hexdigest()
    raw["tenants"].append({"name": "guard-calls", "keys": [{"sha256": key}]})
    checker = {"kind": "guard_model", "model": "guard", "lane": "default", "tenant": "guard-calls"}
    raw["guardrails"] = {
        "checks": [{"name": "llama", "checker": checker, "action": "block",
                    "placement": "pre_call", "budget_s": BUDGET_S}],
        "apply": [{"guardrails": ["llama"], "tenants": ["a"]}],
    }  # fmt: skip
    return raw


@pytest.mark.parametrize(("queue_size", "waited_s"), [(4, BUDGET_S), (0, 0.0)])
async def test_a_full_guard_pool_ends_the_checked_request_within_its_budget(
    queue_size: int, waited_s: float
) -> None:
    """A lane with a queue: the guard call waits there until the budget; without one,
    it is refused at once. Either way the guardrail's failure mode decides."""
    async with running(with_guard_model(queue_size), {}) as h:
        settings = h.runtime.pipeline._settings
        holder = h.inbound(model="guard")._replace(tenant=settings.tenants[1])
        async with h.runtime.pipeline.run(holder):
            assert h.active("g") == 1
            started = h.clock.now()
            task = asyncio.ensure_future(h.ask(h.inbound()))
            with pytest.raises(GatewayError) as caught:
                await driven(h.clock, task, step_s=0.0625)
            assert (caught.value.status, caught.value.code) == (503, "guardrail_unavailable")
            assert "'llama'" in caught.value.message
            assert waited_s <= h.clock.now() - started <= waited_s + 0.0625
            assert len(h.providers["g"].bodies) == 1, "only the holder reached the guard"
            assert h.providers["a"].bodies == [], "the checked request was never sent"
            lane = h.runtime.dispatchers["guard"].view().lanes[0]
            assert lane.queued == 0, "the guard call left the queue"
            assert h.active("g") == 1
        assert h.active("g") == 0


async def test_a_guard_call_is_logged_as_one_charged_to_its_tenant(tmp_path) -> None:
    raw = with_guard_model(0)
    path = tmp_path / "access.log"
    raw["logs"] = {"access": "on", "access_path": str(path)}
    async with running(raw, {}) as h:
        access = h.runtime.pipeline.access
        assert access is not None
        access.start()
        with pytest.raises(GatewayError):  # the fake guard answers "hi", not a verdict
            await h.ask(h.inbound())
        access.close()
    guard, checked = (json.loads(line) for line in path.read_text().splitlines())
    assert (guard["model"], guard["tenant"], guard["status"]) == ("guard", "guard-calls", 200)
    assert guard["guard_call"] is True
    assert "job" not in guard
    assert (checked["model"], checked["tenant"], checked["code"]) == (
        "chat", "a", "guardrail_unavailable",
    )  # fmt: skip
    assert "guard_call" not in checked


async def test_the_overload_ladder_leaves_a_guard_call_to_its_checked_request() -> None:
    """At the worst level only the top lane is served; a top-lane request's guard call,
    in a lower lane, still runs, with the prompt as sent (no trim, no smaller model)."""
    raw = with_guard_model(0)
    raw["scheduling"] = {
        "lanes": [
            {"name": "default", "priority": 10},
            {"name": "guard", "priority": 5},
            {"name": "low", "priority": 0},
        ],
        "overload": {"ladder": {"trim_prompt_tokens": 10, "background_model": "chat"}},
    }
    raw["guardrails"]["checks"][0]["checker"]["lane"] = "guard"
    async with running(raw, {}) as h:
        h.runtime.pipeline._overload.state = OverloadState.INTERACTIVE_ONLY
        prompt = "x" * 400
        with pytest.raises(GatewayError):  # the fake guard answers "hi", not a verdict
            await h.ask(h.inbound(messages=[{"role": "user", "content": prompt}]))
        (sent,) = h.providers["g"].bodies
        assert sent["messages"] == [{"role": "user", "content": prompt}]
