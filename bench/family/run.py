"""`python -m bench.family`: seeded traffic variants, each measured against its own capacity.

For each variant, in the same run: its capacity (the simulator alone, see `capacity`), a
second capacity under its slowdown if it has one, then its traffic through the gateway
with the policy on and with it off. Every variant's scenario is written as a file that
`sluicegate bench run` replays alone; the run's figures go to `family.json` and
`family.txt`, per variant and the worst over variants.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from redis import Redis
from redis.exceptions import RedisError

from bench.family import capacity, compare, document, metrics, rescore, variants
from bench.family.variants import Variant
from sluicegate.bench import page, runreport, summary
from sluicegate.bench.args import loop_factory, positive
from sluicegate.bench.loadgen import make_session
from sluicegate.bench.procs import Child, ServiceError, service
from sluicegate.bench.records import Record
from sluicegate.bench.scenario import Scenario
from sluicegate.bench.stack import TargetError, sim_flags, started
from sluicegate.bench.traffic import Run, Target, Traffic

DEFAULT_OUT = Path("bench/results/family")
FULL = {"duration": 30.0, "probe": 12.0, "steps": 5, "probe_requests": 30}
QUICK = {"duration": 8.0, "probe": 4.0, "steps": 2, "probe_requests": 8}
MAX_PROBE_FACTOR = 2.0
"""A probe lasts `probe` seconds, longer at a low rate to see `probe_requests` requests
(99 % of too few requests says little), but never more than twice `probe`."""
PROBE_DRAIN_MARGIN_S = 1.0
CONNECTIONS = 4096
REDIS_CHECK_S = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--variants", type=positive(int), default=4, help="variants to run (default %(default)s)")
    add("--seed", type=int, default=1, help="the family's seed (default %(default)s)")
    add("--first", type=int, default=0, help="index of the first variant (default %(default)s)")
    add(
        "--duration",
        type=positive(float),
        help=f"seconds of traffic per run (default {FULL['duration']:g}; "
        f"{QUICK['duration']:g} with --quick)",
    )
    add(
        "--probe",
        type=positive(float),
        help=f"seconds per capacity probe (default {FULL['probe']:g}; {QUICK['probe']:g} quick)",
    )
    add(
        "--steps",
        type=positive(int),
        help=f"probes per capacity search (default {FULL['steps']}; {QUICK['steps']} quick)",
    )
    add("--quick", action="store_true", help="short runs and probes, for the smoke test")
    add("--print", action="store_true", help="print the variants' parameters and stop")
    add("--out", type=Path, default=DEFAULT_OUT, help="output folder (default %(default)s)")
    add(
        "--rescore",
        type=Path,
        metavar="DIR",
        help="recompute the figures of a finished run in DIR from its files, running nothing",
    )
    add(
        "--compare",
        action="append",
        default=[],
        metavar="ARM=DIR[,DIR...]",
        help="print each figure as mean [min-max] over each arm's finished runs in the "
        "DIRs, per variant, running nothing (repeat per arm; several runs per arm, since "
        "one run cannot tell two arms apart)",
    )
    add(
        "--reuse",
        type=Path,
        metavar="DIR",
        help="take each variant's capacity from the run in DIR (same seed and variant) "
        "instead of searching it again: for comparing gateway settings on the same traffic",
    )
    add(
        "--policies",
        choices=("on,off", "on", "off"),
        metavar="on,off|on|off",
        default="on,off",
        help="which runs to make per variant (default %(default)s): `on` alone with "
        "--reuse compares gateway settings without repeating the pass-through",
    )
    add(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one gateway setting for every variant (a dotted key, a YAML value), "
        "e.g. scheduling.reserve=0: an experiment, no longer the documented settings",
    )
    add(
        "--redis",
        metavar="URL",
        help="run the policy-on gateway on `store: redis` at URL, so pools, lines and "
        "fair shares go through Redis",
    )
    add(
        "--key-prefix",
        default="sluicegate-bench-family:",
        help="with --redis: each run's keys are under this prefix and a token of the "
        "run's own (default %(default)s)",
    )
    add(
        "--workers",
        type=positive(int),
        default=1,
        help="run the policy-on gateway as `serve --workers N`: N replicas of one fleet "
        "behind the kernel's balancing of connections; needs --redis (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """0 once every variant ran; 1 when a process failed."""
    if args.rescore is not None:
        return rescore.rescore(args.rescore)
    if args.compare:
        return compare.compare(args.compare)
    sizes = QUICK if args.quick else FULL
    duration_s = args.duration or sizes["duration"]
    probe_s = args.probe or sizes["probe"]
    steps = int(args.steps or sizes["steps"])
    probe_requests = int(sizes["probe_requests"])
    drawn = [variants.generate(args.seed, args.first + i) for i in range(args.variants)]
    if args.print:
        for variant in drawn:
            print(f"{variant.name}: {variant.describe()}")
        return 0
    setup = {
        "seed": args.seed,
        "first": args.first,
        "variants": args.variants,
        "duration_s": duration_s,
        "probe_s": probe_s,
        "steps": steps,
        "quick": args.quick,
        "reused_capacity": None if args.reuse is None else str(args.reuse),
        "gateway_changes": list(args.set),
        "policies": args.policies,
        "redis": args.redis,
        "workers": args.workers,
    }
    if args.workers > 1 and args.redis is None:
        print(
            "bench family: --workers above 1 needs --redis URL: the workers are replicas "
            "of one fleet and share their limits there",
            file=sys.stderr,
        )
        return 2
    try:
        changes = [setting(item) for item in args.set]
        known = {} if args.reuse is None else _capacities(args.reuse)
        if args.redis is not None:
            _reachable(args.redis)
    except (ValueError, OSError) as exc:
        print(f"bench family: {exc}", file=sys.stderr)
        return 2
    policies = tuple(args.policies.split(","))
    sized = Sizes(
        duration_s,
        probe_s,
        steps,
        probe_requests,
        known,
        tuple(changes),
        policies,
        Fleet(args.redis, args.key_prefix, args.workers) if args.redis else None,
    )
    results: list[dict[str, Any]] = []
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            for variant in drawn:
                print(f"bench family: {variant.name}: {variant.describe()}", file=sys.stderr)
                results.append(runner.run(_variant(variant, sized, args.out / variant.name)))
                document.write(args.out, document.document(setup, results))
    except (ServiceError, TargetError) as exc:
        print(f"bench family: {exc}", file=sys.stderr)
        return 1
    print(document.text(document.document(setup, results)))
    print(f"bench family: results in {args.out}", file=sys.stderr)
    return 0


@dataclass(frozen=True, slots=True)
class Fleet:
    redis_url: str
    key_prefix: str
    workers: int

    def gateway(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """`config` on Redis under a prefix of its own: keys a run leaves behind (they
        expire) cannot reach the next run's limits."""
        prefix = f"{self.key_prefix}{secrets.token_hex(4)}:"
        return {**config, "store": "redis", "redis": {"url": self.redis_url, "key_prefix": prefix}}

    def serve_args(self) -> tuple[str, ...]:
        return ("--workers", str(self.workers))


@dataclass(frozen=True, slots=True)
class Sizes:
    duration_s: float
    probe_s: float
    steps: int
    probe_requests: int
    known: Mapping[str, Mapping[str, Any]]
    """Capacities found by an earlier run, by variant name (`--reuse`)."""
    changes: tuple[tuple[tuple[str, ...], Any], ...]
    """Gateway settings changed for every variant (`--set`)."""
    policies: tuple[str, ...] = ("on", "off")
    fleet: Fleet | None = None
    """Where the policy-on gateway keeps its state, and how many workers it runs."""

    def probe_length_s(self, rate: float) -> float:
        wanted = self.probe_requests / rate
        return min(self.probe_s * MAX_PROBE_FACTOR, max(self.probe_s, wanted))


async def _variant(variant: Variant, sizes: Sizes, out: Path) -> dict[str, Any]:
    duration_s = sizes.duration_s
    known = sizes.known.get(variant.name)
    if known is not None:
        normal = capacity_from_json(known["normal"])
        slowed = None if known["slowed"] is None else capacity_from_json(known["slowed"])
    else:
        normal = await _capacity(variant, sizes, None, out)
        slowed = None
        if variant.slowdown is not None:
            slowed = await _capacity(variant, sizes, variant.slowdown, out)
    best = normal.best
    result: dict[str, Any] = {
        "variant": variant.name,
        "description": variant.describe(),
        "parameters": document.parameters(variant),
        "capacity": {"normal": capacity_json(normal), "slowed": capacity_json(slowed)},
    }
    if best is None:
        result["error"] = "no capacity found: no probe kept 99 % inside the SLO"
        return result
    slowdown_at_s = variant.slowdown_at * duration_s if variant.slowdown is not None else None
    effective = _effective(normal, slowed, slowdown_at_s, duration_s, _mean_cost_s(variant))
    result["capacity"]["effective"] = effective
    scenario = variants.scenario(
        variant, normal.rate_rps, best.service_s, duration_s, variant.timeout_s() + 5
    )
    gateway = scenario.gateway
    for path, value in sizes.changes:
        gateway = with_setting(gateway, path, value)
    scenario = scenario.model_copy(update={"capacity_rps": effective["rps"], "gateway": gateway})
    _write_scenario(out / "scenario.yaml", scenario)
    basis = document.basis(result, scenario.lanes, duration_s)
    for policy in sizes.policies:
        run_scenario = scenario.model_copy(update={"policy": policy})
        serve_args: tuple[str, ...] = ()
        if policy == "on" and sizes.fleet is not None:
            run_scenario = run_scenario.model_copy(update={"gateway": sizes.fleet.gateway(gateway)})
            serve_args = sizes.fleet.serve_args()
        records, exposition = await _through_gateway(
            run_scenario, out / f"policy-{policy}", serve_args
        )
        result[f"policy_{policy}"] = metrics.figures(
            records, basis, exposition if policy == "on" else None
        )
    return result


async def _capacity(
    variant: Variant, sizes: Sizes, slowdown: float | None, out: Path
) -> capacity.Capacity:
    prompt, output = variant.mean_tokens()
    ceiling = capacity.ceiling_rps(variant.engine(), prompt, output, slowdown or 1.0)
    drain_s = variant.timeout_s() + PROBE_DRAIN_MARGIN_S
    flags = sim_flags(variant.sim())
    if slowdown is not None:
        flags += ["--slowdown", f"{slowdown:g}"]
    label = "slowed" if slowdown else "normal"
    with _sim(flags, out / f"capacity-{label}") as sim:
        target = Target(
            base_url=f"{sim.url}/v1",
            keys={t.name: "unused" for t in variant.tenants},
            label="simulator alone",
            check=sim.check_alive,
        )

        async def measure(rate: float) -> capacity.Probe:
            scenario = variants.probe(variant, rate, sizes.probe_length_s(rate), drain_s)
            found = await _drive(scenario, target)
            return probe_of(rate, found.records, scenario, capacity.work(variant.engine()))

        return await capacity.search(measure, ceiling, sizes.steps)


def probe_of(
    rate: float, records: Sequence[Record], scenario: Scenario, cost: metrics.Cost
) -> capacity.Probe:
    lanes = scenario.lanes
    in_slo = sum(summary.meets(r, lanes[r.lane]) for r in records)
    ok = [r for r in records if r.ok]
    return capacity.Probe(
        rate_rps=rate,
        requests=len(records),
        in_slo=in_slo / len(records) if records else 0.0,
        cost_s=sum(map(cost, records)) / len(records) if records else math.nan,
        service_s=sum(r.e2e_s for r in ok) / len(ok) if ok else math.nan,
    )


@contextmanager
def _sim(flags: Sequence[str], logs: Path) -> Iterator[Child]:
    logs.mkdir(parents=True, exist_ok=True)
    with service("sim", ["sim", *flags], "/health", logs) as sim:
        yield sim


async def _through_gateway(
    scenario: Scenario, out: Path, serve_args: Sequence[str]
) -> tuple[list[Record], str]:
    """The run's records, and the gateway's /metrics once they all ended (with several
    workers, the page that merges them)."""
    with started(scenario, out, serve_args) as target:
        found = await _drive(scenario, target)
        exposition = await _metrics_page(target.metrics["gateway"])
    setup = {
        "file": str(out.parent / "scenario.yaml"),
        "target": target.label,
        "policy": scenario.policy,
        "quick": False,
        "rate_scale": 1.0,
        "gateway_config": target.gateway_config,
    }
    doc = runreport.document(scenario, found, setup)
    runreport.write(out, doc, found.records, scenario.lanes, page.html(doc, runreport.tables(doc)))
    (out / document.GATEWAY_METRICS).write_text(exposition)
    return found.records, exposition


async def _metrics_page(url: str) -> str:
    async with make_session(1) as session, session.get(url) as response:
        response.raise_for_status()
        return await response.text()


async def _drive(scenario: Scenario, target: Target) -> Run:
    async with make_session(CONNECTIONS) as session:
        return await Traffic(scenario, target, session).run()


def _mean_cost_s(variant: Variant) -> float:
    """The expected work of one of the variant's requests (work is linear in tokens), not
    the probe's sample mean: a few long requests more or less in a probe would move it."""
    return capacity.request_cost_s(variant.engine(), *variant.mean_tokens())


def _effective(
    normal: capacity.Capacity,
    slowed: capacity.Capacity | None,
    slowdown_at_s: float | None,
    duration_s: float,
    cost_s: float,
) -> dict[str, float]:
    """Capacity over the run: with a slowdown, each capacity weighted by its time."""
    rps = normal.rate_rps
    assert not math.isnan(rps)
    if slowed is not None and slowdown_at_s is not None:
        slow = 0.0 if slowed.best is None else slowed.rate_rps
        before = slowdown_at_s / duration_s
        rps = before * rps + (1 - before) * slow
    return {"rps": rps, "work": rps * cost_s}


def capacity_json(found: capacity.Capacity | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {
        "rps": found.rate_rps,
        "ceiling_rps": found.ceiling_rps,
        "probes": [
            {
                "rate_rps": p.rate_rps,
                "requests": p.requests,
                "in_slo": p.in_slo,
                "passed": p.passed,
                "cost_s": p.cost_s,
                "service_s": p.service_s,
            }
            for p in found.probes
        ],
    }


def _capacities(folder: Path) -> dict[str, Mapping[str, Any]]:
    """Each variant's capacities as an earlier run's family.json has them."""
    doc = json.loads((folder / "family.json").read_text())
    return {v["variant"]: v["capacity"] for v in doc["variants"] if "error" not in v}


def capacity_from_json(found: Mapping[str, Any]) -> capacity.Capacity:
    """The inverse of `capacity_json`."""
    probes = tuple(
        capacity.Probe(p["rate_rps"], p["requests"], p["in_slo"], p["cost_s"], p["service_s"])
        for p in found["probes"]
    )
    return capacity.Capacity(found["ceiling_rps"], probes)


def _reachable(url: str) -> None:
    """Raise unless Redis answers at `url`: found only when a gateway starts, after the
    capacity searches, it would cost minutes, or leave a gateway running degraded."""
    client = Redis.from_url(url, socket_timeout=REDIS_CHECK_S, socket_connect_timeout=REDIS_CHECK_S)
    try:
        client.ping()
    except RedisError as exc:
        raise ValueError(f"--redis {url}: no answer ({exc})") from exc
    finally:
        client.close()


def setting(item: str) -> tuple[tuple[str, ...], Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--set {item!r}: expected KEY=VALUE")
    return tuple(key.split(".")), yaml.safe_load(value)


def with_setting(config: Mapping[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """`config` with the setting at `path` replaced by `value` (copied, not changed)."""
    head, *rest = path
    inner = config.get(head, {})
    return {**config, head: value if not rest else with_setting(inner, tuple(rest), value)}


def _write_scenario(path: Path, scenario: Scenario) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_scenario_file(scenario))


def _scenario_file(scenario: Scenario) -> str:
    head = (
        f"# {scenario.description}\n# Generated by `python -m bench.family`; capacity_rps was "
        "measured in the same run. Replay alone:\n"
        "#   sluicegate bench run scenario.yaml --policy on|off\n"
    )
    return head + yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False)
