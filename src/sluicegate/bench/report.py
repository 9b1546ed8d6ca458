"""Turn phase runs into the figures the issue names: a table for people, JSON for tools."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from sluicegate.bench.loadgen import Tally
from sluicegate.bench.phases import CLOSED, POISSON, SERIAL, ModeRun, PhaseRun

LATENCY_PHASES = (SERIAL, POISSON)
MB = 1_000_000
DEFINITIONS = {
    "added_latency": "gateway percentile minus direct percentile, same phase and mode; "
    "streaming compares TTFT (send to first response body bytes), non-streaming end-to-end",
    "cpu_per_request": "gateway user+system CPU time (psutil) summed over its own blocks, "
    "divided by the requests it completed in them",
    "cpu_per_chunk": "(CPU per streaming request - CPU per non-streaming request) / chunks per "
    "stream, same phase; chunks are SSE data events before [DONE], counted by the client",
    "throughput_ratio": "gateway req/s over direct req/s, same number of closed-loop workers",
    "rss_peak": "largest gateway RSS sampled every 0.2 s during its blocks",
    "cpu_resolution": "psutil reads CPU time in 10 ms clock ticks on Linux, so each block's "
    "reading is within about 20 ms: figures over few requests (serial, --quick) are coarse",
}


@dataclass(frozen=True, slots=True)
class Figure:
    phase: str
    name: str
    value: float
    unit: str
    limit: float
    at_least: bool = False
    digits: int = 3

    @property
    def passed(self) -> bool:
        """NaN (nothing measured) compares false either way, so it never passes."""
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    @property
    def target(self) -> str:
        return f"{'>=' if self.at_least else '<='} {self.limit:g} {self.unit}".rstrip()


def added_ms(run: ModeRun, q: float) -> float:
    return run.gateway.percentile_ms(q) - run.direct.percentile_ms(q)


def throughput_ratio(run: ModeRun) -> float:
    return _ratio(run.gateway.throughput_rps, run.direct.throughput_rps)


def cpu_per_chunk_us(modes: PhaseRun) -> float:
    streaming, plain = modes["streaming"], modes["non-streaming"]
    extra_ms = streaming.cpu_per_request_ms - plain.cpu_per_request_ms
    return _ratio(1000 * extra_ms, _chunks_per_request(streaming.gateway))


def failed_requests(runs: Mapping[str, PhaseRun]) -> int:
    return sum(
        r.direct.failed + r.gateway.failed for modes in runs.values() for r in modes.values()
    )


def figures(runs: Mapping[str, PhaseRun]) -> list[Figure]:
    """Every target from the issue, each phase where it applies."""
    found: list[Figure] = []
    for phase in LATENCY_PHASES:
        for mode, run in runs[phase].items():
            what = "TTFT" if mode == "streaming" else "end-to-end"
            found.append(Figure(phase, f"added {what} p50", added_ms(run, 50), "ms", 1.0))
            found.append(Figure(phase, f"added {what} p99", added_ms(run, 99), "ms", 5.0))
    for phase, modes in runs.items():
        cpu_ms = modes["non-streaming"].cpu_per_request_ms
        found.append(Figure(phase, "gateway CPU / non-streaming req", cpu_ms, "ms", 0.5))
        found.append(
            Figure(phase, "gateway CPU / streamed chunk", cpu_per_chunk_us(modes), "us", 30)
        )
    closed = runs[CLOSED]
    for mode, run in closed.items():
        ratio = 100 * throughput_ratio(run)
        found.append(
            Figure(CLOSED, f"throughput vs direct, {mode}", ratio, "%", 50, at_least=True, digits=1)
        )
    peak_mb = max(run.use.rss_peak_bytes for run in closed.values()) / MB
    found.append(Figure(CLOSED, "gateway RSS peak", peak_mb, "MB", 150, digits=1))
    found.append(Figure("all", "failed requests", failed_requests(runs), "", 0, digits=0))
    return found


def text(runs: Mapping[str, PhaseRun], found: Sequence[Figure]) -> str:
    details = table(
        ["phase", "mode", "path", "ok", "failed", "p50 ms", "p99 ms", "req/s", "CPU ms/req"],
        [
            row
            for phase, modes in runs.items()
            for mode, run in modes.items()
            for row in _detail_rows(phase, mode, run)
        ],
        left=3,
    )
    targets = targets_table(found)
    notes = "\n".join(f"  {name}: {meaning}" for name, meaning in DEFINITIONS.items())
    return f"{details}\n\n{targets}\n\nDefinitions:\n{notes}\n"


TARGET_HEADERS = ("phase", "figure", "value", "target", "result")


def target_rows(found: Sequence[Figure]) -> list[list[str]]:
    return [
        [
            f.phase,
            f.name,
            f"{num(f.value, f.digits)} {f.unit}".rstrip(),
            f.target,
            "PASS" if f.passed else "MISS",
        ]
        for f in found
    ]


def targets_table(found: Sequence[Figure]) -> str:
    return table(TARGET_HEADERS, target_rows(found), left=2)


def envelope(
    benchmark: str,
    config: Mapping[str, object],
    definitions: Mapping[str, str],
    found: Sequence[Figure],
    **results: object,
) -> dict[str, object]:
    """The JSON document every benchmark writes: what ran, where, and its figures. A
    benchmark that judged no figure (the family reports its own) met no target: null,
    not true."""
    return {
        "benchmark": benchmark,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": dict(config),
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "definitions": dict(definitions),
        **results,
        "figures": [figure_json(f) for f in found],
        "all_targets_met": all(f.passed for f in found) if found else None,
    }


def document(
    config: Mapping[str, object], runs: Mapping[str, PhaseRun], found: Sequence[Figure]
) -> dict[str, object]:
    return envelope(
        "overhead",
        config,
        DEFINITIONS,
        found,
        phases={phase: _phase_json(modes) for phase, modes in runs.items()},
        failed_requests=failed_requests(runs),
    )


def write_json(path: Path, doc: Mapping[str, object]) -> None:
    """orjson writes NaN (nothing measured) as null, so the file stays strict JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")


def _phase_json(modes: PhaseRun) -> dict[str, object]:
    doc: dict[str, object] = {mode: _mode_json(run) for mode, run in modes.items()}
    doc["cpu_per_chunk_us"] = cpu_per_chunk_us(modes)
    return doc


def _mode_json(run: ModeRun) -> dict[str, object]:
    gateway = {
        **_tally_json(run.gateway),
        "cpu_s": run.use.cpu_s,
        "cpu_per_request_ms": run.cpu_per_request_ms,
        "rss_peak_mb": run.use.rss_peak_bytes / MB,
    }
    return {
        "direct": _tally_json(run.direct),
        "gateway": gateway,
        "added_p50_ms": added_ms(run, 50),
        "added_p99_ms": added_ms(run, 99),
        "throughput_ratio": throughput_ratio(run),
    }


def _tally_json(tally: Tally) -> dict[str, object]:
    return {
        "requests": tally.ok,
        "failed": tally.failed,
        "errors": dict(tally.errors),
        "p50_ms": tally.percentile_ms(50),
        "p99_ms": tally.percentile_ms(99),
        "elapsed_s": tally.elapsed_s,
        "throughput_rps": tally.throughput_rps,
        "chunks_per_request": _chunks_per_request(tally),
    }


def figure_json(figure: Figure) -> dict[str, object]:
    return {
        "phase": figure.phase,
        "name": figure.name,
        "value": figure.value,
        "unit": figure.unit,
        "target": figure.target,
        "pass": figure.passed,
    }


def _detail_rows(phase: str, mode: str, run: ModeRun) -> list[list[str]]:
    sides = (("direct", run.direct, math.nan), ("gateway", run.gateway, run.cpu_per_request_ms))
    return [
        [
            phase,
            mode,
            side,
            str(tally.ok),
            str(tally.failed),
            num(tally.percentile_ms(50)),
            num(tally.percentile_ms(99)),
            num(tally.throughput_rps, 0),
            num(cpu_ms),
        ]
        for side, tally, cpu_ms in sides
    ]


def _chunks_per_request(tally: Tally) -> float:
    return tally.chunks / tally.ok if tally.ok else math.nan


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def num(value: float, digits: int = 3) -> str:
    """Adding 0.0 turns a rounded -0.0 into 0.0, so noise around zero prints unsigned."""
    return "-" if math.isnan(value) else f"{round(value, digits) + 0.0:.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int) -> str:
    """Columns before `left` are text (left-aligned); the rest are numbers (right-aligned)."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if index < left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
