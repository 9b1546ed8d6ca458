"""The engine's unit of work, learnt, and the work each tenant asked lately, on explicit times."""

from __future__ import annotations

import math

import pytest

from sluicegate.scheduling.demand import SMOOTHING, EngineUnit, RecentWork


def test_an_output_token_costs_its_decode_step_shared_by_the_sequences_in_it():
    """11 tokens over 1 s after the first: ten steps of 0.1 s, each shared by 4."""
    unit = EngineUnit()
    unit.decoded(11, 1.0, 4)
    assert unit.decode_s_per_token == pytest.approx(0.025)
    unit.decoded(11, 2.0, 4)
    assert unit.decode_s_per_token == pytest.approx(0.025 + SMOOTHING * 0.025)


@pytest.mark.parametrize(("tokens", "span_s", "sequences"), [(1, 1.0, 1), (5, 0.0, 1), (5, 1.0, 0)])
def test_a_stream_that_says_nothing_of_its_steps_teaches_nothing(tokens, span_s, sequences):
    unit = EngineUnit()
    unit.decoded(tokens, span_s, sequences)
    assert unit.decode_s_per_token is None


def test_a_request_asks_its_prefill_and_its_decode_once_both_are_known():
    unit = EngineUnit()
    assert unit.work_s(1000, 10, 10_000.0) is None
    unit.decoded(11, 1.0, 10)
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
