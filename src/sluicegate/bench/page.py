"""The HTML report: the text report's tables plus charts over time, in one standalone file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from sluicegate.bench.runreport import Table
from sluicegate.bench.svg import line_chart

_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
    "table{border-collapse:collapse;margin-bottom:1.5em}"
    "th,td{padding:2px 10px;border-bottom:1px solid #ddd}td.n{text-align:right}"
)
LOAD_LINES = ("offered", "attempts", "accepted", "goodput")


def html(doc: Mapping[str, Any], tables: Sequence[Table]) -> str:
    scenario = doc["scenario"]
    title = f"Scenario {scenario['name']}, {scenario['target']}"
    parts = [
        "<!doctype html>",
        f'<html><head><meta charset="utf-8"><title>{escape(title)}</title>',
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1><p>{escape(scenario['description'])}</p>",
        *(_table(table) for table in tables if table.rows),
        "<h2>Over time</h2>",
        *charts(doc),
        "<h2>Notes</h2><ul>",
        *(f"<li>{escape(note)}</li>" for note in doc["notes"] or ["none"]),
        "</ul><h2>Definitions</h2><dl>",
        *(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in doc["definitions"].items()),
        "</dl></body></html>",
    ]
    return "\n".join(parts) + "\n"


def charts(doc: Mapping[str, Any]) -> list[str]:
    """Load and TTFT per lane from the records, each bin drawn at its middle; one chart per
    gauge scraped from /metrics."""
    series = doc["series"]
    times = [start + series["bin_s"] / 2 for start in series["t_s"]]
    found = [
        line_chart(
            "Requests per second",
            {name: list(zip(times, series[name], strict=True)) for name in LOAD_LINES},
            y_label="per second",
        )
    ]
    for lane, values in series["ttft_p95_ms"].items():
        target = doc["slos"][lane]["ttft_s"]
        found.append(
            line_chart(
                f"TTFT p95, lane {lane}, by send time",
                {"TTFT p95": list(zip(times, values, strict=True))},
                y_label="ms",
                marks={} if target is None else {"SLO": 1000 * target},
            )
        )
    for name, lines in series["metrics"].items():
        found.append(line_chart(name, lines, y_label="gauge"))
    return found


def _table(table: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.headers)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{'' if index < table.left else ' class=n'}>{escape(cell)}</td>"
            for index, cell in enumerate(row)
        )
        + "</tr>"
        for row in table.rows
    )
    return f"<h2>{escape(table.title)}</h2><table><tr>{head}</tr>{body}</table>"
