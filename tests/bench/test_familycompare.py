"""Arms compared over their repeated runs: each figure's mean and range, nothing run."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from bench.family import compare
from bench.family.compare import cell, parse, runs_by_variant, table


def figures(goodput: float, refused: float | None, jain: float = 0.9) -> dict:
    """A run's policy-on figures, as much of them as the comparison reads."""
    return {
        "goodput_of_capacity": goodput,
        "admitted_ttft_p95_s": 1.5,
        "gateway_refusal_p99_ms": 0.5,
        "at_or_below_share": {
            "queue_wait_p95_ms_max": 900.0,
            "refused_fraction_max": 0.5,
            "windowed": {"queue_wait_p95_ms": None, "refused_fraction": refused},
        },
        "within_share": {"queue_wait_p95_ms": 1000.0, "refused_fraction": 0.1},
        "above_share": {"jain_served_of_share": jain, "jain_windowed": math.nan},
    }


def document(*runs: tuple[str, dict | None]) -> dict:
    variants = []
    for name, run in runs:
        variants.append({"variant": name} if run is None else {"variant": name, "policy_on": run})
    return {"variants": variants}


def test_an_arm_is_named_once_and_its_folders_gathered_in_order():
    arms = parse(["base=a,b", "new=c", "base=d"])
    assert arms == {"base": [Path("a"), Path("b"), Path("d")], "new": [Path("c")]}


@pytest.mark.parametrize("spec", ["base", "=a", "base=", "base=,"])
def test_an_item_without_an_arm_or_a_folder_is_refused(spec):
    with pytest.raises(ValueError, match="ARM=DIR"):
        parse([spec])


def test_a_cell_is_the_mean_and_range_of_what_was_measured():
    assert cell([0.2, None, 0.4, math.nan, 0.3], 2) == "0.30 [0.20-0.40]"
    assert cell([1234.0], 0) == "1,234"
    assert cell([None, math.nan], 1) == "-"


def test_each_variant_gathers_its_runs_over_the_documents_and_skips_failed_ones():
    first = document(("v1", figures(0.9, 0.2)), ("v2", None))
    second = document(("v1", figures(1.1, 0.4)), ("v2", figures(1.0, None)))
    found = runs_by_variant([first, second])
    assert [len(found["v1"]), len(found["v2"])] == [2, 1]


def test_the_table_puts_the_arms_of_a_variant_side_by_side():
    counted = figures(1.1, 0.3, 0.9)
    counted["gateway_protected"] = {"queue_wait_p95_ms": 85.0, "refused_fraction": 0.025}
    arms = {
        "base": runs_by_variant([document(("v1", figures(0.9, 0.2, 0.8)))]),
        "new": runs_by_variant(
            [document(("v1", figures(0.9, 0.1, 0.7))), document(("v1", counted))]
        ),
    }
    lines = table(arms).splitlines()
    assert len(lines) == 4
    base, new = (line.split(" | ") for line in lines[2:])
    assert base[:4] == ["| v1", "base", "1", "90.0"]
    assert new[:4] == ["| v1", "new", "2", "100.0 [90.0-110.0]"]
    by_gateway = lines[0].split(" | ").index("by the gateway: wait p95 ms")
    assert new[by_gateway : by_gateway + 2] == ["85", "2.5"], "the one run that counted them"
    assert base[by_gateway : by_gateway + 2] == ["-", "-"]
    assert "20.0 [10.0-30.0]" in new
    assert "0.800 [0.700-0.900]" in new
    assert new[-1] == "- |"


def test_compare_reads_each_folders_document(tmp_path, capsys):
    for name, goodput in (("a", 0.9), ("b", 1.1)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "family.json").write_bytes(orjson.dumps(document(("v1", figures(goodput, 0.2)))))
    assert compare.compare([f"arm={tmp_path / 'a'},{tmp_path / 'b'}"]) == 0
    assert "100.0 [90.0-110.0]" in capsys.readouterr().out


def test_compare_says_what_is_missing_rather_than_failing(tmp_path, capsys):
    (tmp_path / "family.json").write_bytes(orjson.dumps({"config": {}}))
    assert compare.compare([f"arm={tmp_path}"]) == 2
    assert "no 'variants'" in capsys.readouterr().err
    assert compare.compare([f"arm={tmp_path / 'absent'}"]) == 2
