"""Run a benchmark scenario as the user would, and read its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 120


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    """`sluicegate bench ARGS` as a user runs it; asserts it completed."""
    command = [sys.executable, "-m", "sluicegate", "bench", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    return done


def refused_bench(*args: str) -> subprocess.CompletedProcess[str]:
    """`sluicegate bench ARGS` that must stop at once with a usage error (exit 2)."""
    command = [sys.executable, "-m", "sluicegate", "bench", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
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
