"""The ablation's rule: worse than the worse all-on run by more than the all-on gap and by
at least the figure's floor, in at least three variants, keeps a mechanism."""

from __future__ import annotations

import pytest

from bench.family.ablation import FIGURES, judge, missed, table, worse

GOODPUT, TTFT, REFUSAL, JAIN = FIGURES


@pytest.mark.parametrize(
    ("figure", "on", "off", "expected"),
    [
        (GOODPUT, [80.0, 81.0], 77.5, True),  # 2.5 below the worse, gap 1, floor 2
        (GOODPUT, [80.0, 81.0], 78.5, False),  # 1.5 below: under the floor
        (GOODPUT, [80.0, 84.0], 77.0, False),  # 3 below, but the all-on gap is 4
        (GOODPUT, [80.0, 81.0], 90.0, False),  # better
        (TTFT, [1.0, 1.05], 1.2, True),
        (TTFT, [1.0, 1.05], 1.1, False),
        (REFUSAL, [1.0, 1.5], 2.1, True),  # no floor: beyond the gap is enough
        (REFUSAL, [1.0, None], 9.0, False),  # a figure missing tells nothing
        (JAIN, [0.9, 0.92], 0.84, True),
        (JAIN, [0.9, 0.92], 0.86, False),
    ],
)
def test_worse_is_beyond_the_all_on_gap_and_the_floor(figure, on, off, expected):
    assert worse(figure, on, off) is expected


def run(goodput: float, ttft: float = 1.0, jain: float = 0.9) -> dict:
    return {
        "goodput_of_capacity": goodput / 100,
        "admitted_ttft_p95_s": ttft,
        "gateway_refusal_p99_ms": 1.0,
        "above_share": {"jain_served_of_share": jain},
    }


def test_a_mechanism_stays_when_worse_without_it_in_three_variants():
    on = [{f"v{i}": run(80) for i in range(6)}, {f"v{i}": run(81) for i in range(6)}]
    three = {f"v{i}": run(70 if i < 3 else 80) for i in range(6)}
    two = {f"v{i}": run(80, ttft=1.0 if i > 1 else 1.5) for i in range(6)}
    assert judge("three", on, three).kept
    assert not judge("two", on, two).kept
    shown = table(on, {"three": three, "two": two})
    assert "| three | 3 of 6 | kept | +0.00 s (0 of 6) |" in shown
    assert "| two | 2 of 6 | goes | +0.00 s (0 of 6) |" in shown
    assert "| v0 | three off | 70.0* |" in shown


def test_an_arm_misses_the_promise_by_its_worst_variant_beyond_it():
    runs = {"v0": run(80, ttft=2.5), "v1": run(80, ttft=2.1), "v2": run(80, ttft=1.0)}
    runs["v3"] = {**run(80), "admitted_ttft_p95_s": None}
    assert missed(runs) == "+0.50 s (2 of 3)"
