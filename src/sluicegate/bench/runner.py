"""`sluicegate bench run SCENARIO.yaml`: a scenario's traffic, and what came of it.

By default the run starts its own simulator and gateway on loopback (the scenario's
config with the policy on, a pass-through one with it off); `--target` sends the same
traffic to any OpenAI-compatible base URL instead, a backend directly for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sluicegate.bench import page, runreport
from sluicegate.bench.args import loop_factory, positive
from sluicegate.bench.loadgen import make_session
from sluicegate.bench.procs import ServiceError
from sluicegate.bench.scenario import Scenario, ScenarioError, compressed, load, rate_scaled
from sluicegate.bench.stack import TargetError, external, started
from sluicegate.bench.traffic import Run, Target, Traffic

QUICK_DURATION_S = 3.0
QUICK_DRAIN_S = 5.0
DEFAULT_OUT = Path("bench/results")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("scenario", type=Path, help="scenario file (see bench/scenarios/)")
    add(
        "--target",
        metavar="URL",
        help="send to this OpenAI-compatible base URL (http://HOST:PORT/v1) instead of "
        "starting a simulator and gateway; each tenant's key is read from its key_env",
    )
    add("--sim", metavar="URL", help="with --target: the simulator to post events to")
    add(
        "--policy",
        choices=("on", "off"),
        help="override the scenario's policy: on = its gateway config, off = pass-through",
    )
    add(
        "--rate-scale",
        type=positive(float),
        default=1.0,
        help="multiply every Poisson rate, e.g. to probe capacity (default %(default)s)",
    )
    add("--out", type=Path, help=f"output folder (default {DEFAULT_OUT}/NAME-POLICY)")
    add(
        "--quick",
        action="store_true",
        help=f"squeeze the timeline into {QUICK_DURATION_S:g} s and drain at most "
        f"{QUICK_DRAIN_S:g} s, for the smoke test",
    )


def run(args: argparse.Namespace) -> int:
    """0 once the run completed; 2 for a bad scenario; 1 when a process or target failed."""
    try:
        scenario = _prepared(args)
    except ScenarioError as exc:
        print(exc, file=sys.stderr)
        return 2
    where = "target" if args.target else f"policy-{scenario.policy}"
    out = args.out or DEFAULT_OUT / f"{scenario.name}-{where}"
    try:
        with (
            _target(args, scenario, out) as target,
            asyncio.Runner(loop_factory=loop_factory()) as runner,
        ):
            result = runner.run(_drive(scenario, target))
    except (ServiceError, TargetError) as exc:
        print(f"bench run: {exc}", file=sys.stderr)
        return 1
    setup = {
        "file": str(args.scenario),
        "target": target.label,
        "policy": None if args.target else scenario.policy,
        "quick": args.quick,
        "rate_scale": args.rate_scale,
        "gateway_config": target.gateway_config,
    }
    doc = runreport.document(scenario, result, setup)
    runreport.write(out, doc, result.records, scenario.lanes, page.html(doc, runreport.tables(doc)))
    print(runreport.text(doc))
    print(f"bench run: results in {out}", file=sys.stderr)
    return 0


def _prepared(args: argparse.Namespace) -> Scenario:
    scenario = load(args.scenario)
    if args.policy:
        scenario = scenario.model_copy(update={"policy": args.policy})
    if args.rate_scale != 1.0:
        scenario = rate_scaled(scenario, args.rate_scale)
    return compressed(scenario, QUICK_DURATION_S, QUICK_DRAIN_S) if args.quick else scenario


@contextmanager
def _target(args: argparse.Namespace, scenario: Scenario, out: Path) -> Iterator[Target]:
    if args.target:
        yield external(scenario, args.target, args.sim)
        return
    with started(scenario, out) as target:
        yield target


async def _drive(scenario: Scenario, target: Target) -> Run:
    async with make_session(scenario.connections) as session:
        return await Traffic(scenario, target, session).run()
