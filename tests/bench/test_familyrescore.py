"""`python -m bench.family --rescore`: a fabricated run folder, rescored, gives the figures computed
directly from its records."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bench.family import document, metrics, rescore, variants
from sluicegate.bench import report, runreport
from sluicegate.bench.records import Attempt, Record
from sluicegate.observability.metrics import GatewayMetrics
from tests.bench.test_familymetrics import QUEUE_PAGE

VARIANT = variants.generate(1, 0)
DURATION_S = 8.0
STALE = {
    "predictor": {"samples": 9.0, "p50_s": 9.0, "p95_s": 9.0, "source": "then"},
    "gateway_queue": {"queued": 9.0, "unserved_fraction": 0.9, "source": "then"},
    "gateway_refusals": 9.0,
    "gateway_refusal_p99_ms": 9.0,
    "gateway_protected": {"requests": 9.0, "refused_fraction": 0.9, "queue_wait_p95_ms": 9.0},
}


def records(policy: str) -> list[Record]:
    found = []
    for i, tenant in enumerate(VARIANT.tenants):
        for k in range(6):
            start = 0.7 * k + 0.1 * i
            if policy == "on" and k % 3 == 2:
                attempts = (Attempt(start, start + 0.002, 503, "overloaded"),)
            else:
                first = start + 0.2 + 0.3 * k
                attempts = (
                    Attempt(start, first + 1, 200, first_token_s=first, backend_prefill_s=0.05),
                )
            found.append(Record(tenant.name, variants.LANE, i, True, start, attempts, 100 * k, 20))
    return found


def exposition() -> str:
    metrics = GatewayMetrics()
    metrics.refused("chat", "overloaded", 503, 0.0008)
    metrics.queue_waited("m", variants.LANE, 0.3, 0.2, False)
    return metrics.exposition().decode() + QUEUE_PAGE


def fabricate(out: Path, page: bool, stale: Mapping[str, Any] = STALE) -> dict[str, Any]:
    """A finished run's folder whose family.json holds stale figures; the fresh ones."""
    folder = out / VARIANT.name
    scenario = variants.scenario(VARIANT, 2.0, 1.0, DURATION_S, 20.0)
    folder.mkdir(parents=True)
    (folder / "scenario.yaml").write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    result: dict[str, Any] = {
        "variant": VARIANT.name,
        "description": VARIANT.describe(),
        "parameters": document.parameters(VARIANT),
        "capacity": {"effective": {"rps": 2.0, "work": 1.5}},
    }
    basis = document.basis(result, scenario.lanes, DURATION_S)
    fresh = {}
    for policy in ("on", "off"):
        run = folder / f"policy-{policy}"
        run.mkdir()
        runreport.write_records(run / "requests.jsonl", records(policy), scenario.lanes)
        if page and policy == "on":
            (run / document.GATEWAY_METRICS).write_text(exposition())
        gateway = exposition() if policy == "on" else None
        fresh[policy] = metrics.figures(records(policy), basis, gateway)
        result[f"policy_{policy}"] = {"stale": True, **(stale if policy == "on" else {})}
    setup = {"seed": 1, "first": 0, "variants": 1, "duration_s": DURATION_S}
    old = {"config": setup, "created_utc": "then", "machine": {}, "variants": [result]}
    report.write_json(out / "family.json", old)
    return fresh


def json_of(value: object) -> object:
    """As family.json holds it: NaN as null."""
    return orjson.loads(orjson.dumps(value))


def test_a_rescore_recomputes_every_figure_from_the_runs_files(tmp_path: Path) -> None:
    fresh = fabricate(tmp_path, page=True)
    before = (tmp_path / "family.json").read_bytes()
    assert rescore.rescore(tmp_path) == 0
    doc = orjson.loads((tmp_path / "family.json").read_bytes())
    (variant,) = doc["variants"]
    assert variant["policy_on"] == json_of(fresh["on"])
    assert variant["policy_off"] == json_of(fresh["off"])
    assert variant["policy_on"]["predictor"]["samples"] == 1, "read from the saved page"
    assert variant["policy_on"]["gateway_queue"]["queued"] == 10, "read from the saved page"
    assert doc["created_utc"] == "then"
    assert doc["worst"]["on"]["above_share_jain_windowed"] == json_of(
        fresh["on"]["above_share"]["jain_windowed"]
    )
    assert (tmp_path / rescore.BEFORE).read_bytes() == before
    assert "within share at send" in (tmp_path / "family.txt").read_text()


def test_without_the_gateways_page_a_rescore_keeps_the_gateways_figures(tmp_path: Path) -> None:
    fresh = fabricate(tmp_path, page=False)
    assert rescore.rescore(tmp_path) == 0
    (variant,) = orjson.loads((tmp_path / "family.json").read_bytes())["variants"]
    assert {key: variant["policy_on"][key] for key in metrics.GATEWAY_KEYS} == STALE
    assert variant["policy_on"]["within_share"] == json_of(fresh["on"]["within_share"])


def test_a_document_from_before_the_queue_was_counted_keeps_no_figure_for_it(
    tmp_path: Path,
) -> None:
    newer = ("gateway_queue", "gateway_protected")
    older = {key: value for key, value in STALE.items() if key not in newer}
    fabricate(tmp_path, page=False, stale=older)
    assert rescore.rescore(tmp_path) == 0
    doc = orjson.loads((tmp_path / "family.json").read_bytes())
    (variant,) = doc["variants"]
    assert variant["policy_on"]["gateway_queue"] is None
    assert variant["policy_on"]["gateway_protected"] is None
    assert variant["policy_on"]["predictor"] == STALE["predictor"]
    assert doc["worst"]["on"]["queued_unserved_fraction"] is None, "NaN, read back as null"


def test_a_document_missing_an_older_gateway_figure_is_not_rescored(tmp_path: Path) -> None:
    fabricate(tmp_path, page=False, stale={"gateway_queue": STALE["gateway_queue"]})
    assert rescore.rescore(tmp_path) == 1


def test_a_run_older_than_the_full_request_lines_is_not_rescored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fabricate(tmp_path, page=True)
    lines = tmp_path / VARIANT.name / "policy-off" / "requests.jsonl"
    old = [orjson.loads(line) for line in lines.read_bytes().splitlines()]
    for line in old:
        for attempt in line["attempts"]:
            del attempt["first_token_s"]
    lines.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in old))
    assert rescore.rescore(tmp_path) == 1
    assert "first_token_s" in capsys.readouterr().err
    assert not (tmp_path / rescore.BEFORE).exists()
