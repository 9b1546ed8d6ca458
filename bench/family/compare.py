"""`python -m bench.family --compare ARM=DIR[,DIR...]`: the same variants run by several
arms (gateway code or settings), each figure as its mean [min-max] over an arm's runs.

One run per arm cannot tell arms apart: four runs of unchanged code on the same
capacity spread from 18.5 to 28.8 % in one class's refusals (docs/benchmarks.md, the
traffic family's "Noise"). So an arm gets several runs (`--reuse` of one capacity run, repeated) and
is read by its spread, side by side with the others. Nothing runs here.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.family import document

Run = Mapping[str, Any]


def _percent(value: float | None) -> float | None:
    return None if value is None else 100 * value


FIGURES: tuple[tuple[str, int, Callable[[Run], float | None]], ...] = (
    ("goodput %", 1, lambda r: _percent(r["goodput_of_capacity"])),
    ("TTFT p95 s", 2, lambda r: r["admitted_ttft_p95_s"]),
    ("gw refusal p99 ms", 2, lambda r: r["gateway_refusal_p99_ms"]),
    ("at/below share (run): worst wait p95 ms", 0, lambda r: _below(r)["queue_wait_p95_ms_max"]),
    (
        "at/below share (run): worst refused %",
        1,
        lambda r: _percent(_below(r)["refused_fraction_max"]),
    ),
    ("per window: wait p95 ms", 0, lambda r: _windowed(r)["queue_wait_p95_ms"]),
    ("per window: refused %", 1, lambda r: _percent(_windowed(r)["refused_fraction"])),
    ("at send: wait p95 ms", 0, lambda r: r["within_share"]["queue_wait_p95_ms"]),
    ("at send: refused %", 1, lambda r: _percent(r["within_share"]["refused_fraction"])),
    ("by the gateway: wait p95 ms", 0, lambda r: _protected(r, "queue_wait_p95_ms")),
    ("by the gateway: refused %", 1, lambda r: _percent(_protected(r, "refused_fraction"))),
    ("Jain above (run)", 3, lambda r: r["above_share"]["jain_served_of_share"]),
    ("Jain above (windowed)", 3, lambda r: r["above_share"]["jain_windowed"]),
    ("queued, refused after %", 1, lambda r: _percent(document.queued_unserved(r))),
)
"""Each figure's heading, its digits, and how it is read from a run's figures."""


def _below(run: Run) -> Mapping[str, Any]:
    return run["at_or_below_share"]


def _windowed(run: Run) -> Mapping[str, Any]:
    return _below(run)["windowed"]


def _protected(run: Run, figure: str) -> float | None:
    """None from a run whose gateway did not count the requests it judged within."""
    found = document.protected(run)
    return None if found is None else found[figure]


def parse(specs: Sequence[str]) -> dict[str, list[Path]]:
    """`ARM=DIR[,DIR...]` items into each arm's folders, in the order given."""
    arms: dict[str, list[Path]] = {}
    for spec in specs:
        name, _, listed = spec.partition("=")
        folders = [Path(folder) for folder in listed.split(",") if folder]
        if not name or not folders:
            raise ValueError(f"--compare wants ARM=DIR[,DIR...], got {spec!r}")
        arms.setdefault(name, []).extend(folders)
    return arms


def runs_by_variant(documents: Sequence[Mapping[str, Any]]) -> dict[str, list[Run]]:
    """Each variant's policy-on figures over an arm's documents (variants that failed or
    ran without the policy are left out)."""
    found: dict[str, list[Run]] = {}
    for each in documents:
        for result in each["variants"]:
            if "policy_on" in result:
                found.setdefault(result["variant"], []).append(result["policy_on"])
    return found


def cell(values: Sequence[float | None], digits: int) -> str:
    """The mean [min-max] of the values measured; the value alone for one; '-' for none."""
    found = [v for v in values if v is not None and not math.isnan(v)]
    if not found:
        return "-"
    if len(found) == 1:
        return f"{found[0]:,.{digits}f}"
    low, mean, high = min(found), statistics.fmean(found), max(found)
    return f"{mean:,.{digits}f} [{low:,.{digits}f}-{high:,.{digits}f}]"


def table(arms: Mapping[str, Mapping[str, Sequence[Run]]]) -> str:
    """One row per variant and arm (variants in the order first met), a column per figure."""
    variants: dict[str, None] = {}
    for by_variant in arms.values():
        variants.update(dict.fromkeys(by_variant))
    headings = ["variant", "arm", "runs", *(name for name, _, _ in FIGURES)]
    lines = ["| " + " | ".join(headings) + " |", "|" + " --- |" * len(headings)]
    for variant in variants:
        for arm, by_variant in arms.items():
            runs = by_variant.get(variant, [])
            if not runs:
                continue
            cells = [cell([read(r) for r in runs], digits) for _, digits, read in FIGURES]
            lines.append("| " + " | ".join([variant, arm, str(len(runs)), *cells]) + " |")
    return "\n".join(lines)


def compare(specs: Sequence[str]) -> int:
    """0 once the table is printed; 2 when an item or a folder's document is unusable."""
    try:
        arms = {
            name: runs_by_variant(
                [orjson.loads((folder / document.DOCUMENT).read_bytes()) for folder in folders]
            )
            for name, folders in parse(specs).items()
        }
    except (ValueError, OSError, orjson.JSONDecodeError) as exc:
        print(f"bench family: cannot compare: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"bench family: cannot compare: a document has no {exc}", file=sys.stderr)
        return 2
    print(table(arms))
    return 0
