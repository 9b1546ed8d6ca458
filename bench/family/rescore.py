"""`python -m bench.family --rescore DIR`: a finished run's figures again, from its files.

Nothing runs. Each variant's records are read back from its runs' `requests.jsonl` and
judged against what `family.json` says of the variant, so figures added after a run can
be computed for it. The gateway's own figures come from the /metrics page saved after
its run; a run made before that page was saved keeps the gateway figures it had. The old
document stays beside the new one as `family.before-rescore.json`.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from bench.family import document, metrics
from sluicegate.bench import runreport
from sluicegate.bench.scenario import ScenarioError, load

BEFORE = "family.before-rescore.json"
NEWER_GATEWAY_KEYS = frozenset({"gateway_queue", "gateway_protected"})
"""Gateway figures a document written before they were counted lacks: kept as none."""


def rescore(out: Path) -> int:
    """0 once `out`'s document is rewritten; 1 when a file it needs is missing or older
    than the figures need."""
    path = out / document.DOCUMENT
    try:
        old = orjson.loads(path.read_bytes())
        setup = old["config"]
        results = [_variant(r, out / r["variant"], setup["duration_s"]) for r in old["variants"]]
    except (OSError, ScenarioError, orjson.JSONDecodeError) as exc:
        print(f"bench family: cannot rescore: {exc}", file=sys.stderr)
        return 1
    except KeyError as exc:
        print(f"bench family: cannot rescore {out}: no {exc} (older files; rerun)", file=sys.stderr)
        return 1
    shutil.copyfile(path, out / BEFORE)
    doc = document.document(setup, results)
    doc |= {
        "rescored_utc": doc["created_utc"],
        "created_utc": old["created_utc"],
        "machine": old["machine"],
    }
    document.write(out, doc)
    print(document.text(doc))
    print(f"bench family: rescored {out} (the old document is {BEFORE})", file=sys.stderr)
    return 0


def _variant(result: Mapping[str, Any], folder: Path, duration_s: float) -> dict[str, Any]:
    if "error" in result:
        return dict(result)
    lanes = load(folder / "scenario.yaml").lanes
    basis = document.basis(result, lanes, duration_s)
    rescored = dict(result)
    for policy in ("on", "off"):
        if f"policy_{policy}" not in result:
            continue
        run = folder / f"policy-{policy}"
        records = runreport.read_records(run / runreport.FILES["requests"])
        page = run / document.GATEWAY_METRICS
        exposition = page.read_text() if policy == "on" and page.exists() else None
        figures = metrics.figures(records, basis, exposition)
        if policy == "on" and exposition is None:
            kept = result["policy_on"]
            for key in metrics.GATEWAY_KEYS:
                figures[key] = kept.get(key) if key in NEWER_GATEWAY_KEYS else kept[key]
        rescored[f"policy_{policy}"] = figures
    return rescored
