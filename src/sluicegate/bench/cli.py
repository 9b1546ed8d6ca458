"""`sluicegate bench SCENARIO`: each scenario module owns its flags."""

from __future__ import annotations

import argparse

from sluicegate.bench import overhead, refusal, runner

SCENARIOS = {
    "overhead": (
        overhead,
        "latency and CPU the gateway adds in front of a zero-latency backend",
    ),
    "refusal": (refusal, "what a refusal at the gateway's boundary costs the client and gateway"),
    "run": (runner, "a scenario file's traffic against the gateway (policy on or off) or a URL"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scenarios = parser.add_subparsers(dest="scenario", required=True)
    for name, (module, summary) in SCENARIOS.items():
        scenario_parser = scenarios.add_parser(name, help=summary)
        module.add_arguments(scenario_parser)
        scenario_parser.set_defaults(scenario_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args.scenario_run(args))
