"""`python -m bench.family --quick`: one small variant end to end, every figure computed.

The variant is the first of the family whose requests are short, so the smoke stays
short; the figures are whatever the run measured, checked for presence and range only.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from bench.family import variants
from sluicegate.bench.scenario import load
from tests.bench.conftest import is_number, refused_bench, run_bench
from tests.support.processes import free_port
from tests.support.redis import REDIS_URL, redis_or_skip


def small_seed() -> int:
    """The first seed whose variant 0 has few tenants, short answers, a wide batch."""
    for seed in range(1000):
        variant = variants.generate(seed, 0)
        small = (
            variant.slowdown is None
            and len(variant.tenants) <= 3
            and max(t.output().high for t in variant.tenants) <= 150
            and variant.batch >= 16
            and {t.arrival for t in variant.tenants} != {"burst"}
        )
        if small:
            return seed
    raise AssertionError("no small variant in the family")


def fraction(value: object) -> bool:
    return is_number(value) and 0.0 <= value <= 1.0  # type: ignore[operator]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One quick run of the small variant, its folder and what it printed."""
    out = tmp_path_factory.mktemp("family")
    done = run_bench(
        "family", "--variants", "1", "--seed", str(small_seed()), "--quick", "--out", str(out)
    )
    return out, done.stdout


def test_quick_family_finds_capacity_and_reports_every_figure(quick_run: tuple[Path, str]) -> None:
    tmp_path, stdout = quick_run
    seed = small_seed()
    assert "WORST" in stdout
    doc = json.loads((tmp_path / "family.json").read_text())
    (result,) = doc["variants"]
    variant = variants.generate(seed, 0)
    assert result["variant"] == variant.name
    found = result["capacity"]["normal"]
    assert is_number(found["rps"])
    assert 0 < found["rps"] <= found["ceiling_rps"]
    assert any(probe["passed"] for probe in found["probes"])
    assert result["capacity"]["effective"]["rps"] == found["rps"]
    for policy in ("on", "off"):
        figures = result[f"policy_{policy}"]
        assert figures["requests"] > 0
        assert figures["admitted"] > 0
        assert is_number(figures["goodput_of_capacity"])
        assert figures["goodput_of_capacity"] > 0
        assert is_number(figures["goodput_rps_of_capacity"])
        assert 0 < figures["admitted_ttft_p95_s"] < variant.timeout_s()
        refusal = figures["refusal_p99_ms"]
        assert (refusal is None) == (figures["refusals_at_once"] == 0)
        tenants = figures["tenants"]
        assert set(tenants) == {t.name for t in variant.tenants}
        capacity_work = result["capacity"]["effective"]["work"]
        assert sum(t["fair_share"] for t in tenants.values()) <= capacity_work * (1 + 1e-9)
        for tenant in tenants.values():
            assert tenant["demand"] > 0
            assert tenant["served"] >= 0
            assert fraction(tenant["refused_fraction"])
            assert fraction(tenant["failed_fraction"])
            assert tenant["queue_wait_samples"] > 0
            assert tenant["queue_wait_p95_ms"] >= 0
        above = figures["above_share"]
        if above["tenants"] >= 2:
            assert 1 / above["tenants"] <= above["jain_served_of_share"] <= 1 + 1e-9
        if above["tenants_windowed"] >= 2:
            assert 1 / above["tenants_windowed"] <= above["jain_windowed"] <= 1 + 1e-9
        within, beyond = figures["within_share"], figures["beyond_share"]
        assert within["requests"] > 0, "a tenant with nothing outstanding is within share"
        assert within["requests"] + beyond["requests"] == figures["requests"]
        assert sum(t["requests"] for t in within["per_tenant"].values()) == within["requests"]
        assert fraction(within["refused_fraction"])
        predictor = figures["predictor"]
        if policy == "off":
            assert predictor is None
            assert figures["gateway_refusals"] is None
            assert figures["gateway_queue"] is None
        else:
            assert predictor["samples"] >= 0
            queue = figures["gateway_queue"]
            assert queue["queued"] >= 0
            if queue["queued"]:
                assert fraction(queue["unserved_fraction"])
            if predictor["samples"]:
                assert 0 <= predictor["p50_s"] <= predictor["p95_s"]
        assert figures["recovery"] is None
    worst = doc["worst"]["on"]
    assert worst["goodput_of_capacity"] == result["policy_on"]["goodput_of_capacity"]
    assert worst["recovery_s"] is None
    replay = load(tmp_path / variant.name / "scenario.yaml")
    assert replay.capacity_rps == found["rps"]
    assert replay.gateway == variants.gateway_config(variant)
    assert (tmp_path / variant.name / "policy-on" / "gateway-metrics.txt").exists()
    rescore = tmp_path.parent / f"{tmp_path.name}-rescored"
    shutil.copytree(tmp_path, rescore)
    run_bench("family", "--rescore", str(rescore))
    (rescored,) = json.loads((rescore / "family.json").read_text())["variants"]
    assert rescored == result, "the same figures from the run's files alone"


async def test_workers_run_the_policy_on_the_redis_store_as_one_fleet(
    quick_run: tuple[Path, str], tmp_path: Path
) -> None:
    """`--workers 2 --redis`: the same variant and capacity (`--reuse`), the gateway as two
    workers sharing their limits in Redis under the run's own prefix; the merged page
    counts both workers."""
    capacities, _ = quick_run
    async with redis_or_skip() as (client, prefix):
        args = ("family", "--variants", "1", "--seed", str(small_seed()), "--quick")
        args += ("--reuse", str(capacities), "--policies", "on", "--out", str(tmp_path))
        args += ("--redis", REDIS_URL, "--key-prefix", prefix, "--workers", "2")
        await asyncio.to_thread(run_bench, *args)
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
    assert keys, "the workers kept their limits in Redis under the run's prefix"
    doc = json.loads((tmp_path / "family.json").read_text())
    assert doc["config"]["workers"] == 2
    (result,) = doc["variants"]
    assert result["policy_on"]["admitted"] > 0
    assert "policy_off" not in result
    page = (tmp_path / result["variant"] / "policy-on" / "gateway-metrics.txt").read_text()
    assert "sluicegate_workers_reporting 2.0" in page


def test_workers_without_redis_are_refused_before_anything_runs(tmp_path: Path) -> None:
    done = refused_bench("family", "--workers", "2", "--out", str(tmp_path))
    assert "--workers above 1 needs --redis" in done.stderr
    assert not any(tmp_path.iterdir())


def test_an_unreachable_redis_is_refused_before_anything_runs(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    done = refused_bench("family", "--redis", url, "--out", str(tmp_path))
    assert f"bench family: --redis {url}: no answer" in done.stderr
    assert not any(tmp_path.iterdir())
