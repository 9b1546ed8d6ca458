"""`sluicegate bench overhead --quick` runs end to end and writes every figure.

Speed is a benchmark figure, not a test: nothing here checks a timing target.
"""

from __future__ import annotations

from tests.bench.conftest import is_number, run_quick

PHASES = ("serial", "poisson", "closed")
MODES = ("non-streaming", "streaming")


def test_quick_run_reports_every_figure(tmp_path):
    doc = run_quick("overhead", tmp_path)
    assert doc["failed_requests"] == 0
    assert {figure["phase"] for figure in doc["figures"]} == {*PHASES, "all"}
    for phase in PHASES:
        assert is_number(doc["phases"][phase]["cpu_per_chunk_us"])
        for mode in MODES:
            run = doc["phases"][phase][mode]
            for side in ("direct", "gateway"):
                assert run[side]["requests"] > 0, (phase, mode, side)
                assert run[side]["failed"] == 0, (phase, mode, side, run[side]["errors"])
            assert run["gateway"]["cpu_s"] > 0, (phase, mode)
            assert run["gateway"]["rss_peak_mb"] > 0, (phase, mode)
        assert doc["phases"][phase]["streaming"]["gateway"]["chunks_per_request"] > 0
