"""Hostile or slow upstreams seen by the pipeline, with scripted providers and a fake clock:
a peer's Retry-After is bounded, and a long non-streamed answer is neither timed out as a
missing first byte, nor hedged, nor held against its deployment."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.capacity.breaker import BreakerState
from sluicegate.core.errors import GatewayError
from sluicegate.pipeline import Inbound
from sluicegate.providers.base import classify_status
from tests.unit.test_pipeline import Harness, config, driven, running, settle


def slow(h: Harness, name: str, delay_s: float) -> None:
    provider = h.providers[name]
    provider.mode, provider.clock, provider.delay_s = "slow", h.clock, delay_s


async def failure(h: Harness, inbound: Inbound) -> GatewayError:
    task = asyncio.ensure_future(h.ask(inbound))
    with pytest.raises(GatewayError) as info:
        await driven(h.clock, task)
    return info.value


async def test_a_throttles_retry_after_is_held_to_the_deployments_max_cooldown():
    """One 429 saying `Retry-After: 1000000000` once cooled the pool for 31 years."""
    raw = config({"name": "a", "max_cooldown_s": 30, "breaker": {"ramp_s": 0}})
    async with running(raw, {"a": "raise"}) as h:
        h.providers["a"].error = classify_status("a", 429, b"", {"retry-after": "1000000000"})
        err = await failure(h, h.inbound())
        assert (err.code, err.retry_after_s) == ("upstream_throttled", 30)
        h.providers["a"].mode = "answer"
        refused = await failure(h, h.inbound()._replace(timeout_s=1))
        assert refused.code == "pool_cooling_down"
        assert 0 < (refused.retry_after_s or 0) <= 30
        h.clock.advance(31)
        assert await h.ask(h.inbound())


def long_answers(**route: object) -> dict:
    """Two deployments whose first bytes are due within 1 s, allowed 0.1 s per token."""
    timeouts = {"first_byte_s": 1, "output_token_s": 0.1}
    return config(
        {"name": "a", "timeouts": timeouts, "breaker": {"consecutive_failures": 1}},
        {"name": "b", "timeouts": timeouts},
        route={"retry": {"max_attempts": 2}, **route},
    )


async def test_a_long_non_streamed_answer_is_not_a_missing_first_byte():
    """50 tokens asked: `a` may take 1 + 50 x 0.1 = 6 s; it answers in 4 s."""
    async with running(long_answers(), {}) as h:
        slow(h, "a", 4)
        assert await driven(h.clock, asyncio.ensure_future(h.ask(h.inbound(max_tokens=50))))
        assert h.providers["b"].bodies == []
        assert h.runtime.dispatchers["chat"].targets[0].breaker.state is BreakerState.CLOSED


async def test_a_non_streamed_answer_past_its_allowance_is_the_deployments_failure():
    async with running(long_answers(), {}) as h:
        slow(h, "a", 7)
        assert await driven(h.clock, asyncio.ensure_future(h.ask(h.inbound(max_tokens=50))))
        assert len(h.providers["b"].bodies) == 1
        assert h.runtime.dispatchers["chat"].targets[0].breaker.state is BreakerState.OPEN


async def test_a_streamed_answer_keeps_the_plain_first_byte_timeout():
    async with running(long_answers(), {}) as h:
        slow(h, "a", 2)
        await driven(h.clock, asyncio.ensure_future(h.ask(h.inbound(max_tokens=50, stream=True))))
        assert len(h.providers["b"].bodies) == 1


async def test_a_long_non_streamed_answer_is_not_hedged_before_its_allowance():
    """hedge_after_s 1 and 50 tokens at 0.1 s: the hedge waits 6 s; `a` answers in 4 s."""
    async with running(long_answers(hedge_after_s=1), {}) as h:
        slow(h, "a", 4)
        assert await driven(h.clock, asyncio.ensure_future(h.ask(h.inbound(max_tokens=50))))
        assert h.providers["b"].bodies == []
        slow(h, "a", 8)
        assert await driven(h.clock, asyncio.ensure_future(h.ask(h.inbound(max_tokens=50))))
        assert len(h.providers["b"].bodies) == 1


async def test_a_deadline_shorter_than_the_allowance_is_not_the_deployments_failure():
    """A 3 s deadline for an answer allowed 6 s: the caller's limit, not `a`'s fault, so
    its circuit (one failure opens it) stays closed and nothing is retried on `b`."""
    async with running(long_answers(), {}) as h:
        slow(h, "a", 5)
        err = await failure(h, h.inbound(max_tokens=50)._replace(timeout_s=3))
        assert (err.status, err.code) == (504, "deadline_exceeded")
        await settle()
        assert h.providers["b"].bodies == []
        breaker = h.runtime.dispatchers["chat"].targets[0].breaker
        assert (breaker.state, breaker.in_flight) == (BreakerState.CLOSED, 0)


@pytest.mark.parametrize("mode", ["raise", "break"])
async def test_each_failed_attempt_is_counted_whether_it_failed_at_its_start_or_in_its_body(mode):
    async with running(config({"name": "a"}), {"a": mode}) as h:
        h.providers["a"].error = classify_status("a", 502, b"", {})
        err = await failure(h, h.inbound())
        errors = h.runtime.metrics.registry.get_sample_value(
            "sluicegate_upstream_errors_total", {"deployment": "a", "code": err.code}
        )
        assert errors == len(h.providers["a"].bodies) > 0
