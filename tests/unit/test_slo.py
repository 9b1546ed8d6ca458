"""The SLO verdict of one request, its timeline, and the recent tally, on given times."""

from __future__ import annotations

from collections import Counter

import pytest

from sluicegate.core.slo import (
    Kind,
    RecentOutcomes,
    Timeline,
    figures,
    judge_answer,
    judge_error,
    judge_left,
    tpot_s,
)
from sluicegate.core.types import Lane

LANE = Lane("chat", ttft_slo_s=1.0, tpot_slo_s=0.1, e2e_slo_s=10.0)


def timeline(first_byte_s: float | None, arrived_s: float = 100.0) -> Timeline:
    line = Timeline(arrived_s)
    line.admitted_s, line.dispatched_s, line.upstream_s = 100.1, 100.3, 100.6
    line.first_byte_s = first_byte_s
    return line


def test_an_answer_within_every_slo_met_them():
    assert judge_answer(LANE, timeline(100.9), 105.0, 0.05) == ("met", Kind.MET)


def test_a_lane_without_slos_counts_success_as_met():
    assert judge_answer(Lane("any"), timeline(None), 1e6, 9.0) == ("met", Kind.MET)


@pytest.mark.parametrize(
    ("first_byte_s", "ended_s", "tpot", "missed"),
    [
        (101.5, 105.0, 0.05, "ttft_missed"),
        (101.5, 111.0, 0.5, "ttft_missed"),
        (None, 105.0, None, "ttft_missed"),
        (100.9, 105.0, 0.2, "tpot_missed"),
        (100.9, 111.0, 0.2, "tpot_missed"),
        (100.9, 111.0, 0.05, "e2e_missed"),
    ],
)
def test_an_answer_outside_an_slo_names_the_first_one_it_missed(
    first_byte_s, ended_s, tpot, missed
):
    assert judge_answer(LANE, timeline(first_byte_s), ended_s, tpot) == (missed, Kind.MISSED)


def test_a_stream_too_short_for_a_tpot_is_judged_without_one():
    assert tpot_s(100.0, 101.0, 1) is None
    assert tpot_s(100.0, 101.0, None) is None
    assert tpot_s(100.0, 101.0, 5) == pytest.approx(0.25)
    assert judge_answer(LANE, timeline(100.9), 105.0, None) == ("met", Kind.MET)


def test_a_caller_who_left_missed_only_an_slo_that_had_passed():
    assert judge_left(LANE, timeline(None), 100.5) == ("abandoned", Kind.ABANDONED)
    assert judge_left(LANE, timeline(None), 101.5) == ("ttft_missed", Kind.MISSED)
    assert judge_left(LANE, timeline(100.9), 105.0) == ("abandoned", Kind.ABANDONED)
    assert judge_left(LANE, timeline(100.9), 111.0) == ("e2e_missed", Kind.MISSED)
    assert judge_left(None, timeline(None), 1e6) == ("abandoned", Kind.ABANDONED)


def test_an_error_is_a_refusal_the_callers_own_or_a_failure():
    assert judge_error("expired", 503, refused=True) == ("expired", Kind.REFUSED)
    assert judge_error("model_not_found", 404, refused=False) == ("model_not_found", Kind.INVALID)
    assert judge_error("upstream_timeout", 504, refused=False) == (
        "upstream_timeout",
        Kind.FAILED,
    )


def test_the_stages_before_the_first_byte_end_where_the_request_got():
    assert [(s, round(t, 3)) for s, t in timeline(100.7).stages(200.0)] == [
        ("admission", 0.1),
        ("queue", 0.2),
        ("upstream", 0.3),
        ("transfer", 0.1),
    ]
    queued = Timeline(100.0)
    queued.admitted_s = 100.25
    assert [(s, round(t, 3)) for s, t in queued.stages(102.0)] == [
        ("admission", 0.25),
        ("queue", 1.75),
    ]
    streaming = timeline(None)
    assert [s for s, _ in streaming.stages(101.0)] == ["admission", "queue", "upstream"]


def test_recent_outcomes_forget_what_fell_out_of_the_window():
    recent = RecentOutcomes(window_s=60.0, buckets=6)
    key = ("lane", "m", "chat")
    recent.add(key, Kind.MET, 0.0)
    recent.add(key, Kind.MISSED, 30.0)
    recent.add(key, Kind.REFUSED, 55.0)
    recent.add(("tenant", "a", "chat"), Kind.REFUSED, 55.0)
    assert recent.totals(59.0)[key] == {Kind.MET: 1, Kind.MISSED: 1, Kind.REFUSED: 1}
    assert recent.totals(65.0)[key] == {Kind.MISSED: 1, Kind.REFUSED: 1}
    assert recent.totals(200.0) == {}


def test_attainment_is_met_over_accepted_and_goodput_met_per_second():
    tally = {Kind.MET: 6, Kind.MISSED: 1, Kind.FAILED: 1, Kind.REFUSED: 4, Kind.INVALID: 2}
    shown = figures(Counter(tally), 60.0)
    assert shown["offered"] == 14
    assert shown["accepted"] == 8
    assert shown["attainment"] == 0.75
    assert shown["goodput_per_s"] == 0.1
    assert figures(Counter({Kind.REFUSED: 3}), 60.0)["attainment"] is None
