"""`sluicegate bench refusal --quick` runs end to end, refuses, and keeps refusals off the backend.

Speed is a benchmark figure, not a test: nothing here checks a timing target.
"""

from __future__ import annotations

from tests.bench.conftest import is_number, run_quick

KINDS = ("concurrency", "rate")
PHASES = ("serial", "closed")


def test_quick_run_refuses_at_the_boundary(tmp_path):
    doc = run_quick("refusal", tmp_path)
    for kind in KINDS:
        run = doc["kinds"][kind]
        assert run["statuses"][run["expected"]] > 0, (kind, run["statuses"])
        for phase in PHASES:
            block = run[phase]
            assert block["refusals"] > 0, (kind, phase, block["other"])
            for name in ("p50_ms", "p95_ms", "p99_ms", "refusals_per_s", "cpu_per_refusal_ms"):
                assert is_number(block[name]), (kind, phase, name)
    assert doc["admitted"] >= 1
    assert doc["simulator"]["received"] == doc["admitted"]
