"""The family's worst-of row and table, on figures made by hand."""

from __future__ import annotations

import math
from typing import Any

from bench.family import document, metrics
from sluicegate.bench.records import Attempt, Record
from sluicegate.bench.scenario import Slo

BASIS = metrics.Basis(
    {"interactive": Slo(ttft_s=2.0)},
    {"a": 1.0},
    lambda record: 1.0,
    {"rps": 1.0, "work": 1.0},
    4,
    4.0,
    2.0,
    None,
    0.008,
)


def figures(wait_ms: float, refused: float, jain: float, asked: float = 0.5) -> dict[str, Any]:
    attempt = Attempt(0.0, 1.0, 200, first_token_s=0.5, backend_prefill_s=0.1)
    found: dict[str, Any] = metrics.figures(
        [Record("a", "interactive", 0, True, 0.0, (attempt,))], BASIS
    )
    found["within_share"] |= {
        "queue_wait_p95_ms": wait_ms,
        "refused_fraction": refused,
        "asked_of_capacity": asked,
    }
    found["at_or_below_share"]["windowed"] |= {
        "queue_wait_p95_ms": wait_ms / 2,
        "refused_fraction": refused / 2,
    }
    found["above_share"]["jain_windowed"] = jain
    return found


def result(name: str, on: dict[str, Any]) -> dict[str, Any]:
    return {
        "variant": name,
        "description": "",
        "capacity": {"effective": {"rps": 1.0}},
        "policy_on": on,
        "policy_off": figures(0.0, 0.0, math.nan),
    }


def test_the_worst_takes_the_longest_wait_most_refusals_and_lowest_windowed_jain() -> None:
    results = [
        result("v0", figures(120.0, 0.02, 0.97, asked=1.3)),
        result("v1", figures(80.0, math.nan, 0.91)),
        result("v2", figures(math.nan, 0.05, math.nan)),
    ]
    results[0]["policy_on"]["gateway_refusal_p99_ms"] = 3.0
    results[1]["policy_on"]["gateway_refusal_p99_ms"] = None  # kept by a rescore, as read
    results[0]["policy_on"]["pauses"] = {"answers": 9, "longest_s": 2.75, "past_promise": 4}
    results[1]["policy_on"]["pauses"] = {"answers": 9, "longest_s": 1.5, "past_promise": 0}
    for run, (wait_ms, refused) in zip(results[:2], ((40.0, 0.01), (310.0, 0.0)), strict=True):
        run["policy_on"]["gateway_protected"] = {
            "requests": 50.0,
            "refused_fraction": refused,
            "queue_wait_p95_ms": wait_ms,
        }
    results[2]["policy_on"]["gateway_protected"] = {
        "requests": 0.0,
        "refused_fraction": None,
        "queue_wait_p95_ms": None,
    }
    worst = document.worst(results, "on")
    assert (worst["protected_queue_wait_p95_ms"], worst["protected_refused_fraction"]) == (
        310.0,
        0.01,
    ), "v2's gateway judged none within: NaN, read back as null, left out"
    assert (worst["longest_pause_s"], worst["paused_past_promise"]) == (2.75, 4)
    assert worst["gateway_refusal_p99_ms"] == 3.0
    assert worst["within_share_queue_wait_p95_ms"] == 120.0
    assert worst["within_share_refused_fraction"] == 0.05
    assert worst["above_share_jain_windowed"] == 0.91
    assert worst["below_share_windowed_queue_wait_p95_ms"] == 60.0
    assert worst["below_share_windowed_refused_fraction"] == 0.025
    assert worst["within_share_asked_of_capacity"] == 1.3
    doc = document.document({}, results)
    assert doc["all_targets_met"] is None, "the family judges no target in its document"
    text = document.text(doc)
    assert "within share at send: wait p95 ms / refused %" in text
    assert "120 / 2.0" in text
    assert "at or below share (windowed): wait p95 ms / refused %" in text
    assert "60 / 1.0" in text
    assert "within share at send: asked x capacity" in text
    assert "1.30" in text
    assert "Jain above (windowed)" in text
    assert "longest pause s / past promise" in text
    assert "2.75 / 4" in text
    assert "- / 0" not in text, "a run whose answers told no pause reads '-', not 0 past"
    assert "within share by the gateway: queue wait p95 ms / refused %" in text
    assert "310 / 0.0" in text
    assert "310 / 1.0" in text, "the worst row"
    assert "- / -" in text, "v2: nothing judged within"


def test_the_table_gives_each_readings_part_beyond_any_schedulers_reach() -> None:
    on = figures(50.0, 0.0, 0.99)
    on["at_or_below_share"]["beyond_reach_fraction_max"] = 0.354
    on["at_or_below_share"]["windowed"]["beyond_reach_fraction"] = 0.0
    on["within_share"]["beyond_reach_fraction"] = math.nan
    text = document.text(document.document({}, [result("v0", on)]))
    assert "beyond reach % (run / window / send)" in text
    assert "35 / 0 / -" in text


def test_a_run_of_the_policy_alone_reports_without_a_pass_through() -> None:
    """`--policies on` (with `--reuse`): no pass-through run, no worst row for it."""
    alone = result("v0", figures(50.0, 0.0, 0.99))
    del alone["policy_off"]
    doc = document.document({}, [alone])
    assert set(doc["worst"]) == {"on"}
    lines = document.text(doc).splitlines()
    assert not any(line.split()[:2] in (["v0", "off"], ["WORST", "off"]) for line in lines)
    assert any(line.split()[:2] == ["v0", "on"] for line in lines)


def test_a_variant_is_judged_with_the_engines_shortest_step() -> None:
    """The simulator's engine steps 8 ms at the least: what `beyond reach` rests on."""
    result = {
        "parameters": {"tenants": [{"name": "a", "weight": 1}], "batch": 8, "slowdown": None},
        "capacity": {"effective": {"rps": 1.0, "work": 1.0}},
    }
    found = document.basis(result, {"interactive": Slo(ttft_s=2.0)}, 30.0)
    assert found.step_s == 0.008
