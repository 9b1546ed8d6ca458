"""The guardrail around a checker: budgets, failure modes, fallback and cache, on a fake clock."""

from __future__ import annotations

import asyncio
import re

import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.core.guarding import (
    Action,
    CheckerSpec,
    GuardrailSpec,
    OnFailure,
    Placement,
    default_failure,
)
from sluicegate.guardrails.cache import DecisionCache
from sluicegate.guardrails.checker import PASSED, Span, Stage, Verdict
from sluicegate.guardrails.guard import Guardrail, Outcome, masked_pieces, screen
from tests.support.clock import FakeClock


class Digits:
    """Flags runs of five or more digits; counts its calls."""

    name = "digits"

    def __init__(self) -> None:
        self.calls = 0

    async def check(self, text: str, stage: Stage) -> Verdict:
        self.calls += 1
        spans = tuple(Span(m.start(), m.end(), "number") for m in re.finditer(r"\d{5,}", text))
        return Verdict(True, spans, ("number",)) if spans else PASSED


class Slow:
    """Answers only after `delay_s` on the clock (never, if the budget is shorter)."""

    name = "slow"

    def __init__(self, clock: FakeClock, delay_s: float) -> None:
        self.clock = clock
        self.delay_s = delay_s

    async def check(self, text: str, stage: Stage) -> Verdict:
        from sluicegate.core.clock import sleep_until

        await sleep_until(self.clock, self.clock.now() + self.delay_s)
        return PASSED


class Broken:
    name = "broken"

    async def check(self, text: str, stage: Stage) -> Verdict:
        raise ConnectionError("the classifier is down")


class Counts:
    def __init__(self) -> None:
        self.decided: list[tuple[str, str, float]] = []
        self.timeouts = 0
        self.hits = 0
        self.failures: list[str] = []

    def guardrail_decided(self, guardrail: str, outcome: str, took_s: float) -> None:
        self.decided.append((guardrail, outcome, took_s))

    def guardrail_timed_out(self, guardrail: str) -> None:
        self.timeouts += 1

    def guardrail_cached(self, guardrail: str) -> None:
        self.hits += 1

    def guardrail_failed(self, guardrail: str, cause: str) -> None:
        self.failures.append(cause)


def spec(
    action: Action = Action.BLOCK,
    on_failure: OnFailure | None = None,
    budget_s: float = 0.2,
    fallback: CheckerSpec | None = None,
    ttl_s: float = 0.0,
) -> GuardrailSpec:
    return GuardrailSpec(
        "g",
        CheckerSpec("test", {}, budget_s),
        action,
        Placement.PRE_CALL,
        on_failure or default_failure(action),
        fallback,
        cache_ttl_s=ttl_s,
    )


def guard(clock: FakeClock, s: GuardrailSpec, checker, fallback=None, recorder=None) -> Guardrail:
    cache = DecisionCache(clock, b"secret", s.name, "v1", s.cache_ttl_s, 100)
    return Guardrail(s, checker, clock, cache, fallback, recorder)


async def decide_while_advancing(clock: FakeClock, g: Guardrail, text: str, step_s: float):
    task = asyncio.ensure_future(g.check(text, Stage.INPUT))
    while not task.done():
        for _ in range(5):
            await asyncio.sleep(0)
        if not task.done():
            clock.advance(step_s)
    return task.result()


def test_failure_defaults_follow_the_action() -> None:
    assert default_failure(Action.BLOCK) is OnFailure.CLOSED
    assert default_failure(Action.MASK) is OnFailure.CLOSED
    assert default_failure(Action.AUDIT) is OnFailure.OPEN


async def test_a_flagged_text_blocks_naming_the_guardrail_not_the_text() -> None:
    clock = FakeClock()
    decision = await guard(clock, spec(), Digits()).check("card 4111111111111111", Stage.INPUT)
    assert decision.outcome is Outcome.FLAGGED
    err = decision.refusal(Stage.INPUT)
    assert err is not None
    assert err.status == 400
    assert err.code == "guardrail_blocked"
    assert "'g'" in err.message
    assert "4111" not in err.message


async def test_a_slow_checker_fails_closed_within_its_budget() -> None:
    clock = FakeClock()
    counts = Counts()
    g = guard(clock, spec(budget_s=0.25), Slow(clock, 5.0), recorder=counts)
    started = clock.now()
    decision = await decide_while_advancing(clock, g, "hello", 0.0625)
    assert decision.outcome is Outcome.FAILED_CLOSED
    assert clock.now() - started == pytest.approx(0.25)
    err = decision.refusal(Stage.INPUT)
    assert err is not None
    assert (err.status, err.code) == (503, "guardrail_unavailable")
    assert counts.timeouts == 1
    assert counts.decided == [("g", "failed_closed", pytest.approx(0.25))]


async def test_a_slow_audit_checker_fails_open_within_its_budget() -> None:
    clock = FakeClock()
    g = guard(clock, spec(Action.AUDIT, budget_s=0.25), Slow(clock, 5.0))
    started = clock.now()
    decision = await decide_while_advancing(clock, g, "hello", 0.0625)
    assert decision.outcome is Outcome.FAILED_OPEN
    assert decision.refusal(Stage.INPUT) is None
    assert clock.now() - started == pytest.approx(0.25)


async def test_fail_open_can_be_chosen_for_a_blocking_guardrail() -> None:
    clock = FakeClock()
    decision = await guard(clock, spec(on_failure=OnFailure.OPEN), Broken()).check("x", Stage.INPUT)
    assert decision.outcome is Outcome.FAILED_OPEN
    assert decision.refusal(Stage.INPUT) is None


async def test_a_failing_checker_fails_closed_at_once() -> None:
    clock = FakeClock()
    counts = Counts()
    decision = await guard(clock, spec(), Broken(), recorder=counts).check("x", Stage.INPUT)
    assert decision.outcome is Outcome.FAILED_CLOSED
    assert clock.now() == 1000.0
    assert counts.failures == ["broken: ConnectionError"], "the cause, never the message"


async def test_the_fallback_answers_when_the_checker_cannot() -> None:
    clock = FakeClock()
    fallback = Digits()
    s = spec(fallback=CheckerSpec("test", {}, 0.1))
    decision = await guard(clock, s, Broken(), fallback).check("id 123456", Stage.INPUT)
    assert decision.outcome is Outcome.FLAGGED
    assert fallback.calls == 1


async def test_the_fallback_has_its_own_budget_after_the_checker_timed_out() -> None:
    clock = FakeClock()
    s = spec(budget_s=0.25, fallback=CheckerSpec("test", {}, 0.125))
    g = guard(clock, s, Slow(clock, 5.0), Slow(clock, 5.0))
    started = clock.now()
    decision = await decide_while_advancing(clock, g, "x", 0.0625)
    assert decision.outcome is Outcome.FAILED_CLOSED
    assert clock.now() - started == pytest.approx(0.375)


async def test_a_cached_decision_skips_the_checker_until_it_expires() -> None:
    clock = FakeClock()
    checker, counts = Digits(), Counts()
    g = guard(clock, spec(ttl_s=10.0), checker, recorder=counts)
    first = await g.check("id 123456", Stage.INPUT)
    again = await g.check("id 123456", Stage.INPUT)
    assert first == again
    assert checker.calls == 1
    assert counts.hits == 1
    await g.check("id 123456", Stage.OUTPUT)
    assert checker.calls == 2, "a stage is part of the key"
    clock.advance(10.0)
    await g.check("id 123456", Stage.INPUT)
    assert checker.calls == 3


async def test_a_failure_is_not_cached() -> None:
    clock = FakeClock()
    g = guard(clock, spec(ttl_s=10.0), Broken())
    await g.check("x", Stage.INPUT)
    assert len(g._cache) == 0


def test_the_cache_is_bounded_and_keeps_no_text() -> None:
    clock = FakeClock()
    cache = DecisionCache(clock, b"secret", "g", "v1", 60.0, 3)
    for i in range(10):
        cache.put(cache.key(f"secret text {i}", Stage.INPUT), PASSED)
    assert len(cache) == 3
    assert cache.get(cache.key("secret text 9", Stage.INPUT)) == PASSED
    assert cache.get(cache.key("secret text 0", Stage.INPUT)) is None
    assert all(b"secret text" not in key for key in cache._entries)


def test_the_key_depends_on_guardrail_version_and_secret() -> None:
    clock = FakeClock()
    keys = {
        DecisionCache(clock, secret, name, version, 60.0, 3).key("t", Stage.INPUT)
        for secret, name, version in [
            (b"a", "g", "1"),
            (b"b", "g", "1"),
            (b"a", "h", "1"),
            (b"a", "g", "2"),
        ]
    }
    assert len(keys) == 4


async def test_mask_rewrites_only_what_was_found_in_each_piece() -> None:
    clock = FakeClock()
    g = guard(clock, spec(Action.MASK), Digits())
    pieces = await screen([g], ["call 123456", "plain", "or 98765 now"], Stage.INPUT)
    assert pieces == ["call [NUMBER]", "plain", "or [NUMBER] now"]


async def test_a_mask_without_spans_blocks() -> None:
    class Flags:
        name = "flags"

        async def check(self, text: str, stage: Stage) -> Verdict:
            return Verdict(True, (), ("toxic",))

    clock = FakeClock()
    with pytest.raises(GatewayError) as caught:
        await screen([guard(clock, spec(Action.MASK), Flags())], ["x"], Stage.INPUT)
    assert caught.value.code == "guardrail_blocked"
    assert "toxic" in caught.value.message


async def test_audit_lets_a_flagged_text_through_unchanged() -> None:
    clock = FakeClock()
    counts = Counts()
    g = guard(clock, spec(Action.AUDIT), Digits(), recorder=counts)
    assert await screen([g], ["id 123456"], Stage.INPUT) == ["id 123456"]
    assert counts.decided[0][1] == "flagged"


def test_a_span_across_pieces_masks_its_part_of_each() -> None:
    verdict = Verdict(True, (Span(2, 8, "x"),))
    assert masked_pieces(["abcd", "efgh"], verdict) == ["ab[X]", "[X]h"]
