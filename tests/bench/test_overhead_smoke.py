"""`sluicegate bench overhead --quick` runs end to end and writes every figure.

Speed is a benchmark figure, not a test: nothing here checks a timing target.
"""

from __future__ import annotations

import asyncio
import json

from tests.bench.conftest import is_number, run_bench, run_quick
from tests.support.redis import redis_or_skip

PHASES = ("serial", "poisson", "closed")
MODES = ("non-streaming", "streaming")


def failures(doc: dict) -> dict[str, dict[str, int]]:
    """Each failed run's errors by reason, to say what went wrong."""
    return {
        f"{phase} {mode} {side}": modes[mode][side]["errors"]
        for phase, modes in doc["phases"].items()
        for mode in MODES
        for side in ("direct", "gateway")
        if modes[mode][side]["failed"]
    }


def test_quick_run_reports_every_figure(tmp_path):
    doc = run_quick("overhead", tmp_path)
    assert doc["failed_requests"] == 0, failures(doc)
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


def refusals_only(doc: dict) -> bool:
    """Whether every failed request got a named refusal (`http 503 <code>`), and fewer
    than 1 in 100 of the gateway's requests did: on a loaded machine a Redis call may
    come late, and the gateway then refuses clearly; a transport error, a nameless
    status or a share that large is a defect."""
    requests = failed = 0
    for modes in doc["phases"].values():
        for mode in MODES:
            gateway = modes[mode]["gateway"]
            requests += gateway["requests"] + gateway["failed"]
            failed += gateway["failed"]
            for reason in gateway["errors"]:
                if not reason.startswith("http 503 ") or reason.endswith(" -"):
                    return False
    direct = sum(
        modes[mode]["direct"]["failed"] for modes in doc["phases"].values() for mode in MODES
    )
    return direct == 0 and failed * 100 < requests


async def test_workers_run_measures_one_worker_then_several(tmp_path):
    """Both layouts on Redis, each with its own direct blocks; a layout's CPU is that of
    the supervisor and every worker."""
    out = tmp_path / "workers.json"
    async with redis_or_skip():
        done = await asyncio.to_thread(
            run_bench, "overhead", "--quick", "--workers", "2", "--out", str(out)
        )
    assert "== 2 worker(s), store: redis ==" in done.stdout
    docs = json.loads(out.read_text())
    assert set(docs) == {"1 workers", "2 workers"}
    for doc in docs.values():
        assert refusals_only(doc), failures(doc)
        run = doc["phases"]["closed"]["non-streaming"]
        assert run["gateway"]["cpu_s"] > 0
        assert run["direct"]["requests"] > 0
    one = docs["1 workers"]["phases"]["closed"]["non-streaming"]["gateway"]["rss_peak_mb"]
    two = docs["2 workers"]["phases"]["closed"]["non-streaming"]["gateway"]["rss_peak_mb"]
    assert two > 1.5 * one  # two workers and a supervisor are measured, not the parent alone
