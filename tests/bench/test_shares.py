"""Fair shares by weight: over a run, at each request's send, and per window."""

from __future__ import annotations

import pytest

from bench.family import shares
from sluicegate.bench.records import Attempt, Record


def sent(tenant: str, at: float, ends: float, ok: bool = True) -> Record:
    attempt = Attempt(at, ends, 200) if ok else Attempt(at, at + 0.003, 503, "overloaded")
    return Record(tenant, "interactive", 0, True, at, (attempt,), 100, 10)


def unit_cost(record: Record) -> float:
    return 1.0


def test_max_min_gives_the_small_their_demand_and_splits_the_rest_by_weight() -> None:
    found = shares.max_min_shares(
        {"small": 1.0, "mid": 10.0, "big": 10.0, "idle": 0.0},
        {"small": 1.0, "mid": 1.0, "big": 2.0, "idle": 5.0},
        9.0,
    )
    assert found["small"] == 1.0
    assert found["mid"] == pytest.approx(8 / 3)
    assert found["big"] == pytest.approx(16 / 3)
    assert found["idle"] == 0.0


def test_max_min_gives_everyone_their_demand_when_it_fits() -> None:
    demands = {"a": 1.0, "b": 2.0}
    assert shares.max_min_shares(demands, {"a": 1.0, "b": 1.0}, 10.0) == demands


def test_max_min_with_nobody_sated_is_proportional_to_weight() -> None:
    found = shares.max_min_shares({"a": 10.0, "b": 10.0}, {"a": 1.0, "b": 3.0}, 8.0)
    assert found == {"a": 2.0, "b": 6.0}


def test_a_tenant_with_nothing_outstanding_is_within_its_share() -> None:
    hog = [sent("hog", 0.1 * i, 100.0) for i in range(10)]
    small = [sent("small", 5.0, 6.0), sent("small", 7.0, 8.0)]
    within = shares.within_share_at_send(hog + small, {"hog": 1.0, "small": 1.0}, 1)
    assert within[10:] == [True, True], "the first ended before the second was sent"
    assert within[:10] == [True] + [False] * 9


@pytest.mark.parametrize(
    ("burst_weight", "other_weight", "inside"), [(1.0, 1.0, 2), (3.0, 1.0, 3), (1.0, 3.0, 1)]
)
def test_only_a_bursts_requests_up_to_its_share_of_the_batch_are_within(
    burst_weight: float, other_weight: float, inside: int
) -> None:
    other = [sent("other", 0.1 * i, 50.0) for i in range(4)]
    burst = [sent("burst", 1.0, 30.0) for _ in range(10)]
    weights = {"burst": burst_weight, "other": other_weight}
    within = shares.within_share_at_send(other + burst, weights, 4)
    assert within[:4] == [True] * 4, "alone on the backend, up to the whole batch"
    assert within[4:] == [True] * inside + [False] * (10 - inside)


def test_by_window_sums_served_and_share_over_the_windows_above_share() -> None:
    steady = [
        sent("s", 2.0 * w + 0.1 * k, 2.0 * w + 1.0, ok=k != 3) for w in range(4) for k in range(4)
    ]
    burst = [sent("b", 0.5, 1.5, ok=k < 2) for k in range(6)]
    found = shares.by_window(steady + burst, {"s": 1.0, "b": 1.0}, unit_cost, 2.0, 2.0, 8.0)
    # Window 0: demands s 4, b 6 on 4 -> shares 2 each, both above; later s alone, at share.
    assert found.shares == {"s": 2.0, "b": 2.0}
    assert found.served == {"s": 3.0, "b": 2.0}
    assert found.above == [True] * 4 + [False] * 12 + [True] * 6


def test_the_last_window_ends_with_the_run() -> None:
    records = [sent("a", 6.5, 6.6), sent("a", 6.6, 6.7), sent("a", 6.7, 6.8)]
    found = shares.by_window(records, {"a": 1.0}, unit_cost, 2.0, 2.0, 7.0)
    assert found.shares == {"a": 2.0}, "the last window is 1 s long: 2 units, not 4"


def test_a_long_answer_is_served_across_the_windows_it_lasts() -> None:
    """Sent at 1 s and ending at 7 s, a request's work is done over windows 0-3 (a sixth,
    two sixths, two sixths, a sixth), not all in the window it was sent."""
    records = [sent("a", 1.0, 7.0)] + [sent("b", 0.0, 0.5) for _ in range(8)]
    found = shares.by_window(records, {"a": 1.0, "b": 1.0}, unit_cost, 1.0, 2.0, 8.0)
    assert found.served["b"] == pytest.approx(8.0)
    assert "a" not in found.served, "a asked for less than its share in window 0"
    records = [sent("a", 1.0, 7.0), sent("a", 1.0, 1.5), sent("a", 1.0, 1.5)]
    records += [sent("b", 0.0, 0.5)]
    found = shares.by_window(records, {"a": 1.0, "b": 1.0}, unit_cost, 1.0, 2.0, 8.0)
    assert found.served["a"] == pytest.approx(2.0 + 1 / 6)


def test_of_a_burst_only_a_batch_starts_before_a_slot_can_free() -> None:
    """Answers hold a slot 128 ms at least: of 12 sent within 28 ms on 8 slots, 4 cannot
    start within 100 ms; another burst once those spans are over counts again."""
    first = [1.0] * 6 + [1.02] * 6
    assert shares.beyond_reach(first, 8, 0.1, 0.128) == 4
    assert shares.beyond_reach([*first, *[1.2] * 12], 8, 0.1, 0.128) == 8


def test_requests_spread_beyond_the_span_are_all_in_reach() -> None:
    spread = [0.05 * i for i in range(40)]
    assert shares.beyond_reach(spread, 1, 0.1, 0.128) == 0


def test_answers_shorter_than_the_wait_put_everything_in_reach() -> None:
    assert shares.beyond_reach([1.0] * 50, 8, 0.1, 0.09) == 0


def test_spans_that_overlap_each_bound_their_own_requests() -> None:
    """8 start at 0, the next ones not before 0.128 s: of the 10 sent at 0.05, 2 start in
    time at most, so 4 are late in all, not only the first span's 2."""
    assert shares.beyond_reach([0.0] * 10 + [0.05] * 10, 8, 0.1, 0.128) == 4


def test_a_group_within_the_batch_adds_nothing() -> None:
    assert shares.beyond_reach([0.0] * 3 + [1.0] * 12, 8, 0.1, 0.128) == 4


def test_a_send_as_late_as_the_span_allows_opens_the_next_group() -> None:
    """Sent 125 ms after the others, it may start 125 ms later still, just as the first
    slots may come free: in reach."""
    assert shares.beyond_reach([0.0] * 8 + [0.125], 8, 0.125, 0.25) == 0
