"""A scenario run's outputs: JSON for tools, tables for people, every request as a line.

The text and HTML reports render the same tables, built from the JSON document, so the
three never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from sluicegate.bench import report, summary
from sluicegate.bench.records import Attempt, Record
from sluicegate.bench.scenario import Scenario, Slo
from sluicegate.bench.traffic import Run

GOODPUT_OF_CAPACITY_PCT = 90.0
REFUSAL_P99_MS = 2.0
FILES = {
    "summary": "summary.json",
    "report": "report.txt",
    "html": "report.html",
    "requests": "requests.jsonl",
}


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    left: int
    """Columns before this one are text; the rest are right-aligned numbers."""


def document(scenario: Scenario, run: Run, setup: Mapping[str, object]) -> dict[str, object]:
    records, lanes = run.records, scenario.lanes
    span_s = summary.span_s(records, scenario.duration_s)
    load = summary.load(records, lanes, scenario.duration_s, scenario.capacity_rps)
    refusals = summary.refusals(records)
    return report.envelope(
        "run",
        scenario.model_dump(mode="json"),
        summary.DEFINITIONS,
        figures(_phase(setup), load, refusals),
        scenario={"name": scenario.name, "description": scenario.description, **setup},
        load=load,
        statuses=summary.statuses(records),
        latency=summary.latency(records, lanes),
        refusals=refusals,
        fairness=summary.fairness(records, scenario.duration_s),
        slo_accounting=summary.slo_accounting(
            records, lanes, run.gateway_outcomes, _gateway_lanes(setup.get("gateway_config"))
        ),
        series={**summary.series(records, lanes, span_s), "metrics": run.metrics},
        slos={name: slo.model_dump() for name, slo in lanes.items()},
        events=run.events,
        notes=run.notes,
        files=FILES,
    )


def figures(
    phase: str, load: Mapping[str, Any], refusals: Mapping[str, Any]
) -> list[report.Figure]:
    """The issue's targets that this run can speak to; with the policy off, goodput is
    expected to miss (that is the comparison)."""
    found = []
    if load["goodput_of_capacity"] is not None:
        pct = 100 * load["goodput_of_capacity"]
        found.append(
            report.Figure(
                phase, "goodput / capacity", pct, "%", GOODPUT_OF_CAPACITY_PCT, True, digits=1
            )
        )
    at_once = refusals["at_once"]
    if at_once["count"]:
        p99 = at_once["p99_ms"]
        found.append(report.Figure(phase, "refusal at once p99", p99, "ms", REFUSAL_P99_MS))
    return found


def tables(doc: Mapping[str, Any]) -> list[Table]:
    load, fairness, refusals = doc["load"], doc["fairness"], doc["refusals"]
    index = fairness["jain_index"]
    jain = "n/a (no bin had two backlogged tenants)" if _missing(index) else f"{index:.3f}"
    bins = f"{fairness['bins']} bins of {fairness['bin_s']:g} s"
    return [
        Table(
            f"Load, {doc['scenario']['target']}",
            [
                "offered/s",
                "attempts/s",
                "accepted/s",
                "goodput/s",
                "capacity/s",
                "goodput %",
                "tokens/s",
            ],
            [
                [
                    *(_n(load[k], 2) for k in ("offered_rps", "attempts_rps", "accepted_rps")),
                    _n(load["goodput_rps"], 2),
                    _n(load["capacity_rps"], 2),
                    _n(_pct(load["goodput_of_capacity"]), 1),
                    _n(load["tokens_per_s"], 0),
                ]
            ],
            0,
        ),
        Table("Outcomes", ["status kind", "requests", "attempts"], _outcomes(doc["statuses"]), 1),
        Table("Latency, ms", _LATENCY_HEADERS, _latency_rows(doc["latency"]), 2),
        Table(
            "Refusals by the gateway, as the client saw them",
            ["refusal", "count", *(f"p{q} ms" for q in summary.QUANTILES)],
            [
                [name, str(took["count"]), *(_n(took[f"p{q}_ms"]) for q in summary.QUANTILES)]
                for name, took in [("at once", refusals["at_once"]), *refusals["by_code"].items()]
            ],
            1,
        ),
        Table(
            f"Fairness: Jain's index {jain} over {bins}",
            ["tenant", "backlogged s", "tokens served"],
            [
                [tenant, _n(seconds, 0), _n(fairness["service_tokens"].get(tenant, 0.0), 0)]
                for tenant, seconds in fairness["backlogged_s"].items()
            ],
            1,
        ),
        Table(
            "Met SLOs, as the clients judged and as the gateway counted",
            ["lane", "clients", "gateway", "TTFT within 10 ms of the SLO", "agree"],
            [
                [lane, str(c["client_met"]), str(c["gateway_met"]), str(c["near_slo"]), _agree(c)]
                for lane, c in (doc.get("slo_accounting") or {}).items()
            ],
            1,
        ),
        Table(
            "Events",
            ["at s", "faults", "answer"],
            [[_n(e["at_s"], 2), _json(e["faults"]), e["answer"]] for e in doc["events"]],
            0,
        ),
        Table(
            "Targets",
            report.TARGET_HEADERS,
            report.target_rows(figures(_phase(doc["scenario"]), load, refusals)),
            2,
        ),
    ]


def _agree(counts: Mapping[str, Any]) -> str:
    agrees = counts["agrees"]
    return "not comparable" if agrees is None else "yes" if agrees else "NO"


def _gateway_lanes(config: object) -> list[Mapping[str, object]]:
    """The lanes of the gateway config a run's own gateway ran; none for a URL."""
    if not isinstance(config, Mapping):
        return []
    scheduling = config.get("scheduling")
    lanes = scheduling.get("lanes") if isinstance(scheduling, Mapping) else None
    return [lane for lane in lanes or [] if isinstance(lane, Mapping)]


def text(doc: Mapping[str, Any]) -> str:
    head = f"Scenario {doc['scenario']['name']}: {doc['scenario']['description']}".rstrip(": ")
    sections = [head]
    for table in tables(doc):
        if table.rows:
            body = report.table(table.headers, table.rows, left=table.left)
            sections.append(f"{table.title}\n{body}")
    sections.append("Notes:\n" + "\n".join(f"  {note}" for note in doc["notes"] or ["none"]))
    definitions = "\n".join(f"  {k}: {v}" for k, v in doc["definitions"].items())
    sections.append(f"Definitions:\n{definitions}")
    return "\n\n".join(sections) + "\n"


def write(
    out: Path,
    doc: Mapping[str, Any],
    records: Sequence[Record],
    lanes: Mapping[str, Slo],
    page: str,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / FILES["summary"], doc)
    (out / FILES["report"]).write_text(text(doc))
    (out / FILES["html"]).write_text(page)
    write_records(out / FILES["requests"], records, lanes)


def write_records(path: Path, records: Sequence[Record], lanes: Mapping[str, Slo]) -> None:
    with path.open("wb") as lines:
        for record in records:
            lines.write(orjson.dumps(record_json(record, lanes)) + b"\n")


def read_records(path: Path) -> list[Record]:
    """What `write_records` wrote."""
    with path.open("rb") as lines:
        return [record_from_json(orjson.loads(line)) for line in lines if line.strip()]


_TIMES = ("ttft_ms", "tpot_ms", "e2e_ms")
_ATTEMPT_FIELDS = tuple(field.name for field in fields(Attempt))
_ADDED_FIELDS = frozenset({"longest_gap_s"})
"""Attempt fields recorded since later runs: absent from a line, they are unknown."""
_LATENCY_HEADERS = [
    "group",
    "name",
    "requests",
    "ok",
    "in SLO",
    *(f"{what} p{q}" for what in ("TTFT", "TPOT", "e2e") for q in summary.QUANTILES),
]


def _latency_rows(latency: Mapping[str, Any]) -> list[list[str]]:
    groups = [
        *(("tenant", name, group) for name, group in latency["tenant"].items()),
        *(("lane", name, group) for name, group in latency["lane"].items()),
        ("all", "", latency["all"]),
    ]
    return [
        [
            kind,
            name,
            str(group["requests"]),
            str(group["ok"]),
            str(group["in_slo"]),
            *(_n(group[what][f"p{q}"], 1) for what in _TIMES for q in summary.QUANTILES),
        ]
        for kind, name, group in groups
    ]


def _outcomes(statuses: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    requests, attempts = statuses["requests"], statuses["attempts"]
    names = list(dict.fromkeys([*requests, *attempts]))
    return [[name, str(requests.get(name, 0)), str(attempts.get(name, 0))] for name in names]


def record_json(record: Record, lanes: Mapping[str, Slo]) -> dict[str, object]:
    """Every field of the record and its attempts, with the figures derived from them."""
    return {
        "tenant": record.tenant,
        "lane": record.lane,
        "flow": record.flow,
        "stream": record.stream,
        "start_s": record.start_s,
        "end_s": record.end_s,
        "status": record.last.status,
        "error": record.last.error,
        "ttft_s": record.ttft_s,
        "tpot_s": record.tpot_s,
        "e2e_s": record.e2e_s,
        "queue_wait_s": record.queue_wait_s,
        "asked_tokens": [record.asked_prompt_tokens, record.asked_output_tokens],
        "prompt_tokens": record.last.prompt_tokens,
        "output_tokens": record.last.output_tokens,
        "in_slo": summary.meets(record, lanes[record.lane]),
        "attempts": [{name: getattr(a, name) for name in _ATTEMPT_FIELDS} for a in record.attempts],
    }


def record_from_json(line: Mapping[str, Any]) -> Record:
    """The inverse of `record_json`: the rest of its keys are derived from these. A line
    written before every attempt field was kept raises KeyError (but for the longest
    gap, recorded since 2026-12-05: None)."""
    prompt, output = line["asked_tokens"]
    return Record(
        tenant=line["tenant"],
        lane=line["lane"],
        flow=line["flow"],
        stream=line["stream"],
        start_s=line["start_s"],
        attempts=tuple(
            Attempt(*(_attempt_field(attempt, name) for name in _ATTEMPT_FIELDS))
            for attempt in line["attempts"]
        ),
        asked_prompt_tokens=prompt,
        asked_output_tokens=output,
    )


def _attempt_field(attempt: Mapping[str, Any], name: str) -> Any:
    return attempt.get(name) if name in _ADDED_FIELDS else attempt[name]


def _phase(setup: Mapping[str, Any]) -> str:
    return "target" if setup["policy"] is None else f"policy {setup['policy']}"


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction


def _n(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else report.num(value, digits)
