"""The engine's unit of work, learnt, and the work each tenant asked lately, on explicit times."""

from __future__ import annotations

import math

import pytest

from sluicegate.scheduling.demand import SAMPLES, SMOOTHING, EngineUnit
from sluicegate.scheduling.share import RecentWork


def test_an_output_token_costs_its_decode_step_shared_by_the_sequences_in_it():
    """11 tokens over 1 s after the first, nothing prefilled meanwhile: ten steps of
    0.1 s, each shared by 4."""
    unit = EngineUnit()
    unit.streamed(11, 1.0, 0, 4, None)
    assert unit.decode_s_per_token == pytest.approx(0.025)
    unit.streamed(11, 2.0, 0, 4, None)
    assert unit.decode_s_per_token == pytest.approx(0.025 + SMOOTHING * 0.025)


@pytest.mark.parametrize(("tokens", "span_s", "sequences"), [(1, 1.0, 1), (5, 0.0, 1), (5, 1.0, 0)])
def test_a_stream_that_says_nothing_of_its_steps_teaches_nothing(tokens, span_s, sequences):
    unit = EngineUnit()
    unit.streamed(tokens, span_s, 100, sequences, 0.001)
    assert unit.decode_s_per_token is None


def engine_of(decode_s: float, price_s: float) -> list[tuple[int, float, int, int]]:
    """Streams of 11 tokens in batches of 4 through an engine whose step takes `decode_s`
    a sequence plus `price_s` a prompt token prefilled in it, with 0-800 prompt tokens
    prefilled over each one's span: (tokens, span, prompts, sequences)."""
    streams = []
    for i in range(3 * SAMPLES):
        prompts = 200 * (i % 5)
        streams.append((11, 10 * 4 * decode_s + prompts * price_s, prompts, 4))
    return streams


def test_the_price_of_a_prompt_token_is_the_slope_through_the_streams():
    """The spans grow by 100 us for each prompt token the engine prefilled meanwhile: that
    is the price, once enough streams of different prompts have ended, far below the
    budget's 1 ms (prompt tokens over busy time, every decode step's part in it); the
    decode cost is what is left, 10 ms."""
    unit = EngineUnit()
    streams = engine_of(0.01, 0.0001)
    for stream in streams[: SAMPLES - 1]:
        unit.streamed(*stream, 0.001)
    assert unit.prefill_s_per_token is None
    for stream in streams[SAMPLES - 1 :]:
        unit.streamed(*stream, 0.001)
    assert unit.prefill_s_per_token == pytest.approx(0.0001)
    assert unit.decode_s_per_token == pytest.approx(0.01)
    assert unit.work_s(1000, 10, 1000.0) == pytest.approx(0.1 + 10 * 0.01)


def test_the_price_is_no_more_than_the_budgets_and_is_read_only_from_streams_that_differ():
    """The marginal price is no more than the effective one (here capped at 50 us), and
    streams that all saw the same prompts tell no slope: the budget's price stands in
    for it, and the decode cost is their time less that."""
    capped = EngineUnit()
    for stream in engine_of(0.01, 0.0001):
        capped.streamed(*stream, 0.00005)
    assert capped.prefill_s_per_token == pytest.approx(0.00005)
    alike = EngineUnit()
    for _ in range(3 * SAMPLES):
        alike.streamed(11, 10 * 4 * 0.01 + 400 * 0.0001, 400, 4, 0.00005)
    assert alike.prefill_s_per_token is None
    assert alike.decode_s_per_token == pytest.approx(0.01 + 10 * (0.0001 - 0.00005))


def test_a_learnt_price_is_kept_while_the_streams_tell_no_slope_and_is_never_below_zero():
    """Streams alike after the price was learnt tell no slope (spread 5 % of the mean,
    under the quarter needed): the price stays, and the decode cost is read with it.
    Streams whose spans shrink as more was prefilled read a slope below zero: the price
    is 0."""
    unit = EngineUnit()
    for stream in engine_of(0.01, 0.0001):
        unit.streamed(*stream, 0.001)
    for i in range(3 * SAMPLES):
        prompts = 400 + 20 * (i % 2)
        unit.streamed(11, 10 * 4 * 0.01 + prompts * 0.0001, prompts, 4, 0.001)
    assert unit.prefill_s_per_token == pytest.approx(0.0001)
    assert unit.decode_s_per_token == pytest.approx(0.01)
    falling = EngineUnit()
    for tokens, span_s, prompts, sequences in engine_of(0.01, 0.0001):
        falling.streamed(tokens, span_s, 800 - prompts, sequences, 0.001)
    assert falling.prefill_s_per_token == 0.0


def test_a_stream_that_would_leave_no_decode_time_changes_neither_price():
    """Priced at the budget's 1 ms, the prompts prefilled over a stream's span take more
    than the span itself: nothing is learnt from it."""
    unit = EngineUnit()
    unit.streamed(11, 1.0, 0, 4, 0.001)
    unit.streamed(11, 1.0, 40_000, 4, 0.001)
    assert unit.decode_s_per_token == pytest.approx(0.025)
    assert unit.prefill_s_per_token is None


def test_a_request_asks_its_prefill_and_its_decode_once_both_are_known():
    unit = EngineUnit()
    assert unit.work_s(1000, 10, 10_000.0) is None
    unit.streamed(11, 1.0, 0, 10, None)
    assert unit.work_s(1000, 10, None) is None
    assert unit.work_s(1000, 10, 10_000.0) == pytest.approx(0.1 + 10 * 0.01)


def test_work_asked_is_per_weight_and_fades_by_e_every_horizon():
    recent = RecentWork(2.0)
    recent.asked("a", 3.0, 2.0, 10.0)
    recent.asked("a", 1.0, 2.0, 10.0)
    assert recent.level("a", 10.0) == pytest.approx(2.0)
    assert recent.level("a", 12.0) == pytest.approx(2.0 / math.e)
    assert recent.level("nobody", 12.0) == 0.0


def test_a_tenant_silent_long_enough_is_forgotten():
    recent = RecentWork(2.0)
    recent.asked("a", 1.0, 1.0, 0.0)
    assert recent.level("a", 2.0 * 14) == 0.0
    assert recent.level("a", 2.0 * 14) == 0.0
    recent.asked("a", 1.0, 1.0, 30.0)
    assert recent.level("a", 30.0) == pytest.approx(1.0)
