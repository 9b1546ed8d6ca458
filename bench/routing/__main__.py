"""`python -m bench.routing SCENARIO.yaml`: every strategy of a routing scenario in one run.

First the capacity the offered rate is a share of (`probe`), then each phase on fresh
processes with the same seeded plan, in the scenario's order; each phase's figures are
printed as it ends and all of them, with the targets of issue 47 they bear on, written
to OUT/results.json. The seed is drawn at run time unless given, and printed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.routing import measure
from bench.routing import plan as plans
from bench.routing.run import Driver, Outcome, make_session, started, weights
from bench.routing.scenario import Phase, RoutingScenario, load
from sluicegate.bench.args import loop_factory
from sluicegate.bench.procs import ServiceError
from sluicegate.bench.scenario import ScenarioError

DEFAULT_OUT = Path("bench/results")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__)
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--seed", type=int, help="default: the scenario's, else drawn now")
    parser.add_argument("--rate", type=float, help="offered requests/s; skips the probe")
    parser.add_argument("--phases", help="comma-separated phase names to run (default all)")
    parser.add_argument("--out", type=Path, help=f"default {DEFAULT_OUT}/NAME")
    parser.add_argument("--duration", type=float, help="seconds per phase and probe, for a trial")
    args = parser.parse_args(argv)
    try:
        scenario = load(args.scenario)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.duration:
        probe = scenario.probe.model_copy(
            update={"duration_s": args.duration, "warmup_s": args.duration / 4}
        )
        scenario = scenario.model_copy(update={"duration_s": args.duration, "probe": probe})
    seed = args.seed if args.seed is not None else scenario.seed
    if seed is None:
        seed = random.SystemRandom().randrange(1_000_000)
    print(f"routing {scenario.name}: seed {seed}", flush=True)
    out = args.out or DEFAULT_OUT / scenario.name
    phases = scenario.phases
    if args.phases:
        wanted = args.phases.split(",")
        phases = [p for p in phases if p.name in wanted]
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            doc = runner.run(_all(scenario, phases, seed, args.rate, out))
    except ServiceError as exc:
        print(f"bench routing: {exc}", file=sys.stderr)
        return 1
    doc["command"] = " ".join(sys.argv)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    print(table(doc["phases"]))
    for line in doc["targets"]:
        print(line)
    print(f"bench routing: results in {out}", file=sys.stderr)
    return 0


async def _all(
    scenario: RoutingScenario, phases: Sequence[Phase], seed: int, rate: float | None, out: Path
) -> dict[str, Any]:
    doc: dict[str, Any] = {"scenario": scenario.name, "seed": seed}
    if rate is None:
        capacity = await probe(scenario, seed, out / "probe")
        rate = scenario.load * capacity
        doc["capacity_rps"] = capacity
        print(f"capacity {capacity:.2f} requests/s, offered {rate:.2f}", flush=True)
    doc["rate_rps"] = rate
    results: dict[str, dict[str, Any]] = {}
    for phase in phases:
        plan = plans.build(
            seed, scenario.traffic, scenario.tenants, rate, scenario.duration_s, phase.shared
        )
        with started(scenario, phase, out / phase.name) as stack:
            async with make_session() as session:
                driver = Driver(scenario, stack, session, seed)
                outcome = await driver.open_loop(plan, scenario.duration_s, scenario.drain_s)
        results[phase.name] = summary(scenario, outcome)
        print(f"{phase.name}: {orjson.dumps(results[phase.name]).decode()}", flush=True)
    doc["phases"] = results
    doc["targets"] = targets(results)
    return doc


async def probe(scenario: RoutingScenario, seed: int, logs: Path) -> float:
    """Requests/s answered by closed-loop clients past the warm-up: round robin over every
    replica, or one unslowed replica times the replicas' summed speed."""
    one = scenario.probe.kind == "one_replica"
    replicas = 1 if one else scenario.replicas
    clients = math.ceil(scenario.probe.clients_per_slot * scenario.max_num_seqs * replicas)
    with started(scenario, Phase(strategy="round_robin"), logs, replicas=replicas) as stack:
        async with make_session() as session:
            driver = Driver(scenario, stack, session, seed)
            outcome = await driver.closed_loop(
                seed, scenario.traffic, clients, scenario.probe.duration_s
            )
    warm = scenario.probe.warmup_s
    done = [r for r in outcome.records if r.error is None and warm <= r.end_s <= outcome.elapsed_s]
    rps = len(done) / (outcome.elapsed_s - warm)
    speed = sum(1 / s for s in scenario.slowdowns()) if one else 1.0
    return rps * speed


def summary(scenario: RoutingScenario, outcome: Outcome) -> dict[str, Any]:
    records = outcome.records
    backends = outcome.backends
    hits = sum(b.get("vllm:prefix_cache_hits_total", 0.0) for b in backends.values())
    queries = sum(b.get("vllm:prefix_cache_queries_total", 0.0) for b in backends.values())
    served = [b.get("vllm:request_success_total", 0.0) for b in backends.values()]
    above = measure.above_share(outcome.waiting, scenario.max_backend_waiting)
    working = outcome.working_set[len(outcome.working_set) // 3 :]
    estimates = [
        g["sluicegate_prefix_estimated_hit_ratio"]
        for g in outcome.gateways
        if "sluicegate_prefix_estimated_hit_ratio" in g
    ]
    reasons: dict[str, float] = {}
    for gateway in outcome.gateways:
        for name, value in gateway.items():
            if name.startswith("sluicegate_placements_total/"):
                reason = name.split("/", 1)[1]
                reasons[reason] = reasons.get(reason, 0.0) + value
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "requests": len(records),
        "errors": errors,
        "ttft_p50_s": measure.ttft(records, 50),
        "ttft_p95_s": measure.ttft(records, 95),
        "tokens_per_s": measure.tokens_per_s(records),
        "ceiling": measure.ceiling(records),
        "hit_ratio": hits / queries if queries else math.nan,
        "estimated_hit_ratio": sum(estimates) / len(estimates) if estimates else None,
        "per_replica": dict(zip(backends, served, strict=True)),
        "max_over_mean": measure.max_over_mean(served),
        "queue_above_target": above,
        "working_set_tokens": sum(working) / len(working) / plans.CHARS_PER_TOKEN
        if working
        else 0.0,
        "working_set_over_kv": sum(working)
        / len(working)
        / plans.CHARS_PER_TOKEN
        / scenario.kv_cache_tokens
        if working
        else 0.0,
        "jain_weighted": measure.weighted_jain(records, weights(scenario), outcome.elapsed_s),
        "placements": reasons,
    }


def targets(results: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 47's targets that the phases run bear on, each with its figures."""
    lines: list[str] = []
    rr = results.get("round_robin")
    pa = results.get("prefix_affinity")
    if rr and pa and pa["ceiling"] > 0:
        ceiling = pa["ceiling"]
        gap = ceiling - rr["hit_ratio"]
        closed = (pa["hit_ratio"] - rr["hit_ratio"]) / gap if gap > 0 else math.nan
        lines.append(
            f"gap closed {closed:.2f} (>= 0.60): hit {rr['hit_ratio']:.3f} -> "
            f"{pa['hit_ratio']:.3f}, ceiling {ceiling:.3f}"
        )
        for q in ("ttft_p50_s", "ttft_p95_s"):
            ok = pa[q] < rr[q]
            lines.append(f"{q} prefix_affinity {pa[q]:.3f} < round_robin {rr[q]:.3f}: {ok}")
        lines.append(f"prefix_affinity max/mean {pa['max_over_mean']:.3f} (<= 1.25)")
    if rr:
        for name, figures in results.items():
            if name == "round_robin" or "unshared" in name or "equal" in name:
                continue
            ratio = figures["tokens_per_s"] / rr["tokens_per_s"]
            jain = figures["jain_weighted"] - rr["jain_weighted"]
            lines.append(
                f"{name}: tokens/s {ratio:.3f} x round_robin (>= 0.95); Jain "
                f"{figures['jain_weighted']:.3f} vs {rr['jain_weighted']:.3f} "
                f"({jain:+.3f}, >= -0.05)"
            )
    fleet = results.get("prefix_affinity-2gw")
    if fleet and pa:
        ratio = fleet["hit_ratio"] / pa["hit_ratio"]
        lines.append(f"two gateways' hit ratio {ratio:.3f} x one's (>= 0.9)")
    runs = [results[n] for n in ("round_robin-unshared", "round_robin-unshared-2") if n in results]
    alone = results.get("prefix_affinity-unshared")
    if alone and len(runs) == 2:
        for q in ("ttft_p50_s", "ttft_p95_s", "tokens_per_s"):
            low, high = sorted(r[q] for r in runs)
            lines.append(
                f"unshared {q}: prefix_affinity {alone[q]:.3f}, round robin {low:.3f}..{high:.3f}"
            )
    ll = results.get("least_loaded")
    equal = results.get("least_loaded-equal")
    if ll and equal:
        worst = max(ll["queue_above_target"].values())
        lines.append(
            f"least_loaded: worst replica above its target in {worst:.3f} of scrapes (<= 0.05)"
        )
        ratio = ll["ttft_p95_s"] / equal["ttft_p95_s"]
        lines.append(f"least_loaded TTFT p95 {ratio:.2f} x equal replicas' (<= 1.5)")
    return lines


def table(results: dict[str, dict[str, Any]]) -> str:
    names = [
        "phase",
        "requests",
        "errors",
        "TTFT p50 s",
        "TTFT p95 s",
        "tokens/s",
        "hit",
        "ceiling",
        "max/mean",
        "above target",
        "Jain",
    ]
    rows = ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
    for name, r in results.items():
        above = max(r["queue_above_target"].values()) if r["queue_above_target"] else math.nan
        rows.append(
            f"| {name} | {r['requests']} | {sum(r['errors'].values())} | {r['ttft_p50_s']:.3f} | "
            f"{r['ttft_p95_s']:.3f} | {r['tokens_per_s']:.0f} | {r['hit_ratio']:.3f} | "
            f"{r['ceiling']:.3f} | {r['max_over_mean']:.2f} | {above:.3f} | "
            f"{r['jain_weighted']:.3f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    started_s = time.monotonic()
    code = main()
    print(f"bench routing: {time.monotonic() - started_s:.0f} s", file=sys.stderr)
    sys.exit(code)
