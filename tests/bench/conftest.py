"""Run a benchmark scenario as the user would, and read its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 120
ROOT = Path(__file__).resolve().parents[2]
"""The repository, where the research harness (`python -m bench.family`) runs from."""


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _command(args: tuple[str, ...]) -> list[str]:
    """`sluicegate bench ARGS`, or the research harness for `family ARGS`."""
    if args[:1] == ("family",):
        return [sys.executable, "-m", "bench.family", *args[1:]]
    return [sys.executable, "-m", "sluicegate", "bench", *args]


def _run(args: tuple[str, ...], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(args), capture_output=True, text=True, timeout=timeout_s, check=False, cwd=ROOT
    )


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    """The benchmark as a user runs it; asserts it completed."""
    done = _run(args, TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return done


def refused_bench(*args: str) -> subprocess.CompletedProcess[str]:
    """The benchmark, which must stop at once with a usage error (exit 2)."""
    done = _run(args, 60)
    assert done.returncode == 2
    return done


def run_quick(scenario: str, folder: Path) -> dict:
    """`sluicegate bench SCENARIO --quick`; asserts it completed and printed its verdicts."""
    out = folder / f"{scenario}.json"
    done = run_bench(scenario, "--quick", "--out", str(out))
    assert "PASS" in done.stdout or "MISS" in done.stdout
    doc = json.loads(out.read_text())
    for figure in doc["figures"]:
        assert is_number(figure["value"]), figure
    return doc
