"""`sluicegate serve | check | sim | bench`: each subcommand owns its flags in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import version

DESCRIPTION = """Sluicegate, an LLM gateway that shares a few model deployments between chat
users, batch jobs and agents: it keeps the work it accepts inside the backends' real
capacity, shares it fairly between tenants and lanes, and refuses early and honestly.
`serve` with no --config runs a demo against a built-in simulated backend."""


def main(argv: Sequence[str] | None = None) -> None:
    from sluicegate import serve as serving
    from sluicegate.bench import cli as bench_cli
    from sluicegate.config import check
    from sluicegate.sim import cli as sim_cli

    parser = argparse.ArgumentParser(prog="sluicegate", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('sluicegate')}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway (the demo when no --config)")
    serving.add_arguments(serve)
    serve.set_defaults(run=serving.run)
    checking = commands.add_parser(
        "check", help="report every problem of a config at once, without starting"
    )
    check.add_arguments(checking)
    checking.set_defaults(run=check.run)
    sim = commands.add_parser("sim", help="run the vLLM-like simulated backend")
    sim_cli.add_arguments(sim)
    sim.set_defaults(run=sim_cli.run)
    bench = commands.add_parser("bench", help="load benchmarks on loopback")
    bench_cli.add_arguments(bench)
    bench.set_defaults(run=bench_cli.run)
    args = parser.parse_args(argv)
    sys.exit(args.run(args))
