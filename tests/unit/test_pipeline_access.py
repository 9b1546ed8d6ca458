"""What the pipeline writes of each finished request: one access-log line (its stages,
attempts and deployments tried, never its prompt) under its request id, and refusals and
upstream failures in the operator log, a line per reason and window."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.core.ids import RequestContext, current
from sluicegate.providers.base import classify_status
from tests.unit.test_pipeline import ENV, config, driven, running

SECRET = "the-prompt-nobody-may-read"


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_retried_request_leaves_one_line_with_its_attempts_and_no_prompt(tmp_path):
    path = tmp_path / "access.log"
    raw = config(
        {"name": "a"},
        {"name": "b"},
        route={"retry": {"max_attempts": 2, "base_s": 0}},
        logs={"access": "on", "access_path": str(path)},
    )
    async with running(raw, {"a": "fail"}) as h:
        access = h.runtime.pipeline.access
        assert access is not None
        access.start()
        token = current.set(RequestContext("req-retried"))
        try:
            inbound = h.inbound(messages=[{"role": "user", "content": SECRET}])
            await driven(h.clock, asyncio.ensure_future(h.ask(inbound)))
        finally:
            current.reset(token)
        access.close()
    text = path.read_text()
    assert SECRET not in text
    assert ENV["A_KEY"] not in text
    (line,) = lines_of(path)
    assert line["request_id"] == "req-retried"
    assert (line["status"], line["kind"], line["outcome"]) == (200, "met", "met")
    assert (line["attempts"], line["deployments"]) == (2, ["a", "b"])
    assert (line["route"], line["model"], line["lane"], line["tenant"]) == (
        "chat",
        "chat",
        "default",
        "a",
    )
    assert set(line["stages_ms"]) == {"admission", "queue", "upstream", "transfer"}
    assert line["completion_tokens"] == 2


async def test_off_builds_nothing():
    async with running(config({"name": "a"}), {}) as h:
        assert h.runtime.pipeline.access is None


async def test_refusals_are_warned_once_a_window_by_reason(caplog):
    caplog.set_level(logging.WARNING, logger="sluicegate")
    async with running(config({"name": "a"}), {}) as h:
        for _ in range(20):
            with pytest.raises(GatewayError) as info:
                await h.ask(h.inbound()._replace(timeout_s=0.001))
            assert info.value.code == "deadline_exceeded"
    refused = [r for r in caplog.records if "refused on chat" in r.getMessage()]
    assert len(refused) == 1
    assert "deadline_exceeded" in refused[0].getMessage()


async def test_upstream_failures_are_warned_once_a_window_by_deployment_and_code(caplog):
    caplog.set_level(logging.WARNING, logger="sluicegate")
    raw = config({"name": "a"}, route={"retry": {"max_attempts": 1}})
    async with running(raw, {"a": "raise"}) as h:
        h.providers["a"].error = classify_status("a", 503, b"", {})
        for _ in range(5):
            with pytest.raises(GatewayError):
                await h.ask(h.inbound())
    failed = [r for r in caplog.records if "deployment a failed" in r.getMessage()]
    assert len(failed) == 1
