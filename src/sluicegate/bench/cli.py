"""`sluicegate bench SCENARIO`: each scenario module owns its flags."""

from __future__ import annotations

import argparse

from sluicegate.bench import overhead


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scenarios = parser.add_subparsers(dest="scenario", required=True)
    overhead_parser = scenarios.add_parser(
        "overhead", help="latency and CPU the gateway adds in front of a zero-latency backend"
    )
    overhead.add_arguments(overhead_parser)
    overhead_parser.set_defaults(scenario_run=overhead.run)


def run(args: argparse.Namespace) -> int:
    return int(args.scenario_run(args))
