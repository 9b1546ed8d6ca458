"""The prefill budget on explicit times: what it admits before and after a measure, and
what it learns from first tokens."""

from __future__ import annotations

import pytest

from sluicegate.scheduling.prefill import PrefillBudget


def test_before_any_measure_one_request_goes_at_a_time_however_short():
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    assert budget.admits(100_000)
    budget.sent(1, 100_000, 0.0)
    assert not budget.admits(1)
    assert budget.limit() is None


def test_the_first_token_teaches_the_rate_and_the_limit_follows_the_promise_part():
    """20,000 tokens/s x 1 s, once the budget has seen that many prefilled together."""
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    budget.proven = 20_000
    budget.sent(1, 3_000, 0.0)
    assert budget.first_token(1, 0.15)
    assert budget.tokens_per_s == pytest.approx(20_000)
    for key in range(2, 8):
        assert budget.admits(3_000)
        budget.sent(key, 3_000, 0.2)
    assert budget.pending == 18_000
    assert not budget.admits(3_000)
    assert budget.admits(2_000)


def test_the_budget_grows_to_twice_what_it_has_seen_prefilled_together():
    """One 3,000-token prompt measured: 6,000 may wait together next, not the 20,000 the
    rate would allow; once those reached their first tokens together, 12,000."""
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    budget.sent(0, 3_000, 0.0)
    budget.first_token(0, 0.15)
    assert budget.limit() == 6_000
    budget.sent(1, 3_000, 1.0)
    budget.sent(2, 3_000, 1.0)
    assert not budget.admits(1)
    budget.first_token(1, 1.3)
    budget.first_token(2, 1.3)
    assert budget.limit() == 12_000


def test_a_request_that_waited_is_allowed_only_what_its_promise_has_left():
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    budget.proven = 100_000
    budget.sent(0, 2_000, 0.0)
    budget.first_token(0, 0.1)
    budget.sent(1, 2_000, 1.0)
    assert budget.admits(2_000, left_s=1.5)
    assert not budget.admits(2_000, left_s=0.15), "4,000 tokens take 0.2 s"
    assert not budget.admits(1, left_s=-0.5)


def test_prompts_prefilled_together_are_measured_together():
    """Six prompts sent at once reach their first token in one engine step: the busy
    period is one measure of 18,000 tokens in 0.9 s, not six of 3,000 in 0.9 s."""
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    for key in range(6):
        budget.sent(key, 3_000, 0.0)
    for key in range(6):
        budget.first_token(key, 0.9)
    assert budget.tokens_per_s == pytest.approx(20_000)
    assert budget.pending == 0


def test_first_tokens_of_one_step_that_arrive_apart_are_still_one_measure():
    """Ten prompts prefilled in one 1 s step, their first tokens handled 0.1 ms apart
    (each stream's relay in its own turn of the event loop): 20,000 tokens/s, not the
    33,600 a fade at each first token made of it."""
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    for key in range(10):
        budget.sent(key, 2_000, 0.0)
    for key in range(10):
        budget.first_token(key, 1.0 + key * 0.000_1)
    assert budget.tokens_per_s == pytest.approx(20_000, rel=0.01)


def test_idle_time_between_busy_periods_is_not_counted():
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    budget.sent(1, 2_000, 0.0)
    budget.first_token(1, 0.1)
    budget.sent(2, 2_000, 50.0)
    budget.first_token(2, 50.1)
    assert budget.tokens_per_s == pytest.approx(20_000)


def test_a_request_that_ends_without_a_first_token_frees_its_tokens_and_teaches_nothing():
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    budget.sent(1, 3_000, 0.0)
    assert budget.dropped(1)
    assert budget.pending == 0
    assert budget.tokens_per_s is None
    assert budget.admits(3_000)
    assert not budget.dropped(1)
    assert not budget.first_token(1, 1.0)


def test_a_slower_backend_lowers_the_limit():
    budget = PrefillBudget(within_s=1.0, now_s=0.0)
    budget.proven = 100_000
    budget.sent(0, 4_000, 0.0)
    budget.first_token(0, 0.2)
    fast = budget.limit()
    for key in range(1, 40):
        start = key * 10.0
        budget.sent(key, 4_000, start)
        budget.first_token(key, start + 0.6)
    assert fast == pytest.approx(20_000)
    assert budget.limit() == pytest.approx(4_000 / 0.6, rel=0.05)
