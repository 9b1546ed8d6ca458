"""`sluicegate check --config FILE`: every problem of a config in one report, nothing run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluicegate.config.loader import ConfigError, load_settings
from sluicegate.core.clock import MonotonicClock
from sluicegate.guardrails.build import Guardrails
from sluicegate.guardrails.guardmodel import Messages
from sluicegate.guardrails.plugin import PluginError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        required=True,
        metavar="FILE",
        help="the YAML config to check, its ${VARIABLES} read from the environment",
    )


def run(args: argparse.Namespace) -> int:
    """0 when `serve` would start with this config, 2 with every reason it would not."""
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2
    try:
        # Built as `serve` builds them: what only a checker's library knows (a phone
        # region, an importable plug-in) is checked too. Nothing is asked.
        Guardrails(settings.guardrails, MonotonicClock(), ask_for=lambda settings: _unasked)
    except PluginError as exc:
        print(f"sluicegate: {args.config}: {exc}", file=sys.stderr)
        return 2
    lanes = ", ".join(lane.name for lane in settings.scheduling.lanes)
    print(
        f"{args.config}: valid: {len(settings.models)} models, "
        f"{len(settings.tenants)} tenants, lanes {lanes}"
    )
    return 0


async def _unasked(messages: Messages) -> str:
    raise AssertionError("check asks no guard model")
