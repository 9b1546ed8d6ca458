"""`python -m bench.family.ablation`: which scheduling mechanism earns its place.

Two runs with every mechanism on, on the same variants, say how far a figure moves by
chance; an arm with one mechanism off is *worse* on a figure when it is worse than the
worse of the two by more than their gap, and by at least the figure's floor. A mechanism
is kept when some figure is worse without it in at least `KEEP_IN` variants; otherwise
it goes. The figures are read from each run's `family.json`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.family import document

Run = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    read: Callable[[Run], float | None]
    higher_is_better: bool
    floor: float
    """The least difference that counts, beyond the gap between the all-on runs."""
    digits: int


def _percent(value: float | None) -> float | None:
    return None if value is None else 100 * value


FIGURES = (
    Figure("goodput %", lambda r: _percent(r["goodput_of_capacity"]), True, 2.0, 1),
    Figure("TTFT p95 s", lambda r: r["admitted_ttft_p95_s"], False, 0.1, 2),
    Figure("gw refusal p99 ms", lambda r: r["gateway_refusal_p99_ms"], False, 0.0, 1),
    Figure("Jain above", lambda r: r["above_share"]["jain_served_of_share"], True, 0.05, 3),
)
KEEP_IN = 3
"""Variants (of six) in which some figure must be worse for a mechanism to stay."""
PROMISE_S = 2.0
"""docs/configuration.md's top-lane promise (`ttft_slo_s`) the family runs with."""


def worse(figure: Figure, on: Sequence[float | None], off: float | None) -> bool:
    """Whether `off` is worse than the worse of the all-on values `on` by more than their
    gap and by at least the figure's floor; a figure missing anywhere tells nothing."""
    if off is None or any(value is None for value in on):
        return False
    values = [float(value) for value in on if value is not None]
    gap = max(values) - min(values)
    margin = min(values) - off if figure.higher_is_better else off - max(values)
    return margin > gap and margin >= figure.floor


@dataclass(frozen=True, slots=True)
class Verdict:
    arm: str
    worse_in: dict[str, list[str]]
    """Per variant, the figures worse without the mechanism."""

    @property
    def kept(self) -> bool:
        return sum(bool(figures) for figures in self.worse_in.values()) >= KEEP_IN


def policy_on(folder: Path) -> dict[str, Run]:
    """Each variant's policy-on figures in a finished run's folder."""
    doc = orjson.loads((folder / document.DOCUMENT).read_bytes())
    return {v["variant"]: v["policy_on"] for v in doc["variants"] if "policy_on" in v}


def judge(arm: str, on: Sequence[Mapping[str, Run]], off: Mapping[str, Run]) -> Verdict:
    worse_in: dict[str, list[str]] = {}
    for variant, run in off.items():
        if not all(variant in each for each in on):
            continue
        worse_in[variant] = [
            figure.name
            for figure in FIGURES
            if worse(figure, [figure.read(each[variant]) for each in on], figure.read(run))
        ]
    return Verdict(arm, worse_in)


def _cell(figure: Figure, run: Run | None) -> str:
    value = None if run is None else figure.read(run)
    return "-" if value is None else f"{value:.{figure.digits}f}"


MISSED = f"worst admitted TTFT p95 past the {PROMISE_S:g} s promise (variants past it)"


def missed(runs: Mapping[str, Run]) -> str:
    """How far an arm misses the promise: its worst variant's admitted TTFT p95 beyond
    `PROMISE_S` (0 when none is beyond), and in how many variants it is."""
    p95s = [p95 for run in runs.values() if (p95 := run["admitted_ttft_p95_s"]) is not None]
    past = [p95 - PROMISE_S for p95 in p95s if p95 > PROMISE_S]
    return f"{max(past, default=0.0):+.2f} s ({len(past)} of {len(p95s)})"


def table(on: Sequence[Mapping[str, Run]], arms: Mapping[str, Mapping[str, Run]]) -> str:
    """Markdown: per variant and arm the four figures, each off arm's worse figures
    marked with `*`, then each arm's verdict."""
    variants = sorted({variant for each in on for variant in each})
    verdicts = {arm: judge(arm, on, runs) for arm, runs in arms.items()}
    head = ["variant", "arm", *(figure.name for figure in FIGURES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in variants:
        rows = [(f"all on #{i + 1}", each.get(variant), []) for i, each in enumerate(on)]
        for arm, runs in arms.items():
            rows.append((f"{arm} off", runs.get(variant), verdicts[arm].worse_in.get(variant, [])))
        for label, run, marked in rows:
            cells = [
                _cell(figure, run) + ("*" if figure.name in marked else "") for figure in FIGURES
            ]
            lines.append("| " + " | ".join([variant, label, *cells]) + " |")
    lines += [
        "",
        f"| mechanism | variants worse without it | verdict | {MISSED} |",
        "|---|---|---|---|",
    ]
    for i, each in enumerate(on):
        lines.append(f"| all on #{i + 1} | | | {missed(each)} |")
    for arm, verdict in verdicts.items():
        count = sum(bool(figures) for figures in verdict.worse_in.values())
        kept = "kept" if verdict.kept else "goes"
        lines.append(
            f"| {arm} | {count} of {len(verdict.worse_in)} | {kept} | {missed(arms[arm])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.family.ablation", description=__doc__)
    parser.add_argument("--on", type=Path, nargs=2, required=True, help="the two all-on runs")
    parser.add_argument(
        "--arm", action="append", default=[], metavar="NAME=DIR", help="a run with NAME off"
    )
    args = parser.parse_args(argv)
    try:
        on = [policy_on(folder) for folder in args.on]
        arms = {}
        for spec in args.arm:
            name, sep, folder = spec.partition("=")
            if not sep:
                parser.error(f"--arm wants NAME=DIR, got {spec!r}")
            arms[name] = policy_on(Path(folder))
    except (OSError, ValueError, KeyError) as exc:
        print(f"ablation: cannot read a run: {exc}", file=sys.stderr)
        return 2
    print(table(on, arms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
