"""What holds the batch lane back in a `small-slow-backend` run: sampled, then summarised.

`record` finds the run's gateway (a `sluicegate serve` whose config names MARKER, e.g.
a tenant key variable only that scenario uses), then every INTERVAL seconds reads its
`/admin/status` (with the scenario's loopback admin key), a few gauges of its
`/metrics` and the simulator's running and waiting requests, one JSON line per sample,
until the gateway goes away. Start it beside the run, under the same lock:

    flock /tmp/sluicegate-bench.lock sh -c '
      .venv/bin/python bench/small_slow_probe.py record /tmp/ss-on/probe.jsonl &
      .venv/bin/sluicegate bench run bench/scenarios/small-slow-backend.yaml \
        --policy on --out /tmp/ss-on; wait'

`summarise RUN_DIR...` prints, for each run folder, each lane's figures from its
`requests.jsonl` (tokens/s over the lane's own first send to last end, which the run's
report gives for all lanes together only) and, from its `probe.jsonl`, the state of the
dispatch rules while the batch lane had requests queued in the gateway, before and
after the interactive traffic ended (a pass-through run has no status: the backend's
running and waiting counts only). Loopback only; reads nothing else.
"""

from __future__ import annotations

import json
import math
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

ADMIN_KEY = "sk-bench-small-slow-admin"
"""The scenario's loopback admin key (its sha256 is in the scenario file)."""
MARKER = "SMALL_SLOW_KEY_A"
INTERVAL_S = 0.5
FIND_TIMEOUT_S = 60.0
GONE_AFTER = 3
"""Failed reads in a row after which the gateway is taken to have stopped."""
GAUGES = ("sluicegate_overload_pressure",)
SIM_GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}
TOP, BATCH = "interactive", "background"
PAUSED = ("batch_paused", "interactive_only")


def find_gateway(marker: str) -> tuple[str, str]:
    """The base URLs of the gateway whose config file names `marker`, and its simulator."""
    deadline = time.monotonic() + FIND_TIMEOUT_S
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            found = _serving(process, marker)
            if found is not None:
                return found
        time.sleep(0.2)
    raise SystemExit(f"no gateway with {marker} in its config after {FIND_TIMEOUT_S:g} s")


def _serving(process: psutil.Process, marker: str) -> tuple[str, str] | None:
    args = process.info["cmdline"] or []
    if "serve" not in args or "--config" not in args or "--port" not in args:
        return None
    try:
        config = Path(args[args.index("--config") + 1]).read_text()
        sim = process.environ().get("SLUICEGATE_SIM_URL")
    except (OSError, psutil.Error):
        return None
    if marker not in config or sim is None:
        return None
    port = args[args.index("--port") + 1]
    return f"http://127.0.0.1:{port}", sim


def _get(url: str, key: str | None = None) -> bytes | None:
    request = urllib.request.Request(url)
    if key is not None:
        request.add_header("authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return bytes(response.read())
    except OSError:
        return None


def _values(text: bytes, names: Iterable[str]) -> dict[str, float]:
    """The sum over labels of each wanted family (a counter by its name without _total)."""
    wanted, found = set(names), {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name in wanted:
            found[family.name] = sum(
                s.value for s in family.samples if not s.name.endswith("_created")
            )
    return found


def sample(gateway: str, sim: str) -> dict[str, Any] | None:
    metrics = _get(f"{gateway}/metrics")
    if metrics is None:
        return None
    status = _get(f"{gateway}/admin/status", ADMIN_KEY)
    engine = _get(f"{sim}/metrics")
    return {
        "t": time.monotonic(),
        "status": None if status is None else json.loads(status),
        "gateway": _values(metrics, GAUGES),
        "sim": {} if engine is None else _named(_values(engine, SIM_GAUGES)),
    }


def _named(values: Mapping[str, float]) -> dict[str, float]:
    return {SIM_GAUGES[name]: value for name, value in values.items()}


def record(out: Path, marker: str = MARKER) -> None:
    gateway, sim = find_gateway(marker)
    out.parent.mkdir(parents=True, exist_ok=True)
    failures = 0
    with out.open("w") as lines:
        while failures < GONE_AFTER:
            found = sample(gateway, sim)
            failures = 0 if found is not None else failures + 1
            if found is not None:
                lines.write(json.dumps(found) + "\n")
                lines.flush()
            time.sleep(INTERVAL_S)


# Summaries


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as lines:
        yield from (json.loads(line) for line in lines if line.strip())


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def lanes(run: Path) -> dict[str, dict[str, float]]:
    """Per lane: requests, outcomes, TTFT and end-to-end quantiles, tokens/s."""
    by_lane: dict[str, list[dict[str, Any]]] = {}
    for line in _lines(run / "requests.jsonl"):
        by_lane.setdefault(line["lane"], []).append(line)
    found = {}
    for lane, records in sorted(by_lane.items()):
        ok = [r for r in records if r["error"] == "ok"]
        ttft = [1000 * r["ttft_s"] for r in ok if r["ttft_s"] is not None]
        span = max(r["end_s"] for r in records) - min(r["start_s"] for r in records)
        tokens = sum(r["prompt_tokens"] + r["output_tokens"] for r in ok)
        retried = sum(len(r["attempts"]) > 1 for r in records)
        found[lane] = {
            "requests": len(records),
            "ok": len(ok),
            "not_ok": len(records) - len(ok),
            "retried": retried,
            "in_slo": sum(bool(r["in_slo"]) for r in records),
            "ttft_p50_ms": _pct(ttft, 50),
            "ttft_p95_ms": _pct(ttft, 95),
            "ttft_max_ms": max(ttft, default=float("nan")),
            "e2e_p50_s": _pct([r["e2e_s"] for r in ok], 50),
            "span_s": span,
            "tokens_per_s": tokens / span if span > 0 else 0.0,
        }
    return found


def _lane(status: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    server = status.get("server", status)
    return next(iter(server["models"].values()))["lanes"][name]


def _checks(status: Mapping[str, Any]) -> Mapping[str, Any]:
    server = status.get("server", status)
    return next(iter(server["models"].values()))["checks"]


def _state(status: Mapping[str, Any]) -> str:
    return str(status.get("server", status)["overload"]["state"])


def _batch_work(sample: Mapping[str, Any]) -> bool:
    lane = _lane(sample["status"], BATCH)
    return bool(lane["queued"] + lane["in_flight"])


def phases(run: Path) -> list[tuple[str, float, float]]:
    """The batch burst's life in run seconds: while the top lane sent, and after."""
    records = list(_lines(run / "requests.jsonl"))
    top_end = max((r["end_s"] for r in records if r["lane"] == TOP), default=0.0)
    batch_end = max((r["end_s"] for r in records if r["lane"] == BATCH), default=0.0)
    found = [("with interactive traffic", 0.0, min(top_end, batch_end))]
    if batch_end > top_end:
        found.append(("after it", top_end, batch_end))
    return found


def batch_tokens_per_s(run: Path, start_s: float, end_s: float) -> float:
    """The batch lane's tokens of the requests that ended in [start_s, end_s), per second."""
    tokens = sum(
        r["prompt_tokens"] + r["output_tokens"]
        for r in _lines(run / "requests.jsonl")
        if r["lane"] == BATCH and r["error"] == "ok" and start_s <= r["end_s"] < end_s + 1e-9
    )
    return tokens / (end_s - start_s) if end_s > start_s else 0.0


def rules(samples: list[dict[str, Any]], share_cap: int) -> dict[str, float]:
    """How much of the backend was busy and which dispatch rule stood in the batch lane's
    way, over the samples in which it had requests queued in the gateway: fractions of
    those samples (several rules may hold at once)."""
    waiting = [s for s in samples if _lane(s["status"], BATCH)["queued"] > 0]
    if len(waiting) < 2:
        return {"samples": len(waiting)}
    first, last = waiting[0], waiting[-1]
    seconds = last["t"] - first["t"]

    def share(test: Any) -> float:
        return sum(bool(test(s)) for s in waiting) / len(waiting)

    def mean(value: Any) -> float:
        return sum(value(s) for s in waiting) / len(waiting)

    def grew(read: Any) -> float:
        return float(read(last) - read(first))

    return {
        "samples": len(waiting),
        "seconds": seconds,
        "backend_running_mean": mean(lambda s: s["sim"].get("running", 0.0)),
        "backend_waiting_mean": mean(lambda s: s["sim"].get("waiting", 0.0)),
        "batch_in_flight_mean": mean(lambda s: _lane(s["status"], BATCH)["in_flight"]),
        "top_in_flight_mean": mean(lambda s: _lane(s["status"], TOP)["in_flight"]),
        "at_share": share(lambda s: _lane(s["status"], BATCH)["in_flight"] >= share_cap),
        "paused": share(lambda s: _state(s["status"]) in PAUSED),
        "degraded_or_worse": share(lambda s: _state(s["status"]) != "normal"),
        "gate_closed": share(lambda s: "open" not in s["status"].get("gates", {}).values()),
        "batch_dispatched_per_s": grew(lambda s: _lane(s["status"], BATCH)["dispatched"]) / seconds,
        "refused_lane_share": grew(lambda s: _checks(s["status"])["lane_share"]["refused"]),
        "refused_backend_gate": grew(
            lambda s: _checks(s["status"]).get("backend_gate", {}).get("refused", 0)
        ),
        "pressure_max": max(s["gateway"].get("sluicegate_overload_pressure", 0) for s in waiting),
    }


def busy(samples: list[dict[str, Any]]) -> dict[str, float]:
    """For a run without admin status (pass-through): the backend while it had a queue."""
    queued = [s for s in samples if s["sim"].get("waiting", 0) > 0]
    if not queued:
        return {"samples": 0}
    return {
        "samples": len(queued),
        "seconds": queued[-1]["t"] - queued[0]["t"],
        "backend_running_mean": sum(s["sim"]["running"] for s in queued) / len(queued),
        "backend_waiting_mean": sum(s["sim"]["waiting"] for s in queued) / len(queued),
    }


def probed(run: Path) -> Iterator[str]:
    """The probe's lines, per phase of the burst, aligned on the batch lane's first work
    (the burst is sent at the run's t = 0; a sample every INTERVAL_S)."""
    samples = list(_lines(run / "probe.jsonl"))
    with_status = [s for s in samples if s["status"] is not None]
    if not any(_batch_work(s) for s in with_status):
        yield "probe (backend): " + _joined(busy(samples))
        return
    t0 = next(s["t"] for s in with_status if _batch_work(s))
    cap = share_cap(run)
    for name, start_s, end_s in phases(run):
        inside = [s for s in with_status if start_s <= s["t"] - t0 < end_s]
        figures = {
            "from_s": start_s,
            "to_s": end_s,
            "batch_tokens_per_s": batch_tokens_per_s(run, start_s, end_s),
            **rules(inside, cap),
        }
        yield f"probe, {name}: " + _joined(figures)


def _config(run: Path) -> Any:
    """The gateway config the run used, as its summary records it."""
    return json.loads((run / "summary.json").read_text())["scenario"]["gateway_config"]


def share_cap(run: Path) -> int:
    """The batch lane's slots of the pool in the run's gateway config (as ShareCheck)."""
    config = _config(run)
    pool = config["pools"][0]["max_concurrency"]
    lane = next(lane for lane in config["scheduling"]["lanes"] if lane["name"] == BATCH)
    return max(1, math.floor(lane.get("max_share", 1.0) * pool))


def summarise(runs: list[Path]) -> None:
    for run in runs:
        print(f"== {run}")
        for lane, figures in lanes(run).items():
            print(f"  {lane}: " + _joined(figures))
        if (run / "probe.jsonl").exists():
            for line in probed(run):
                print(f"  {line}")


def _joined(figures: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {_fmt(v)}" for k, v in figures.items())


def _fmt(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.3g}"


def main() -> None:
    command, *args = sys.argv[1:] or ["help"]
    if command == "record" and len(args) in (1, 2):
        record(Path(args[0]), *args[1:])
    elif command == "summarise" and args:
        summarise([Path(a) for a in args])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
