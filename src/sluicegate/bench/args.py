"""Command-line pieces every benchmark scenario shares."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Mapping

REDIS_URL = "redis://127.0.0.1:6379/0"


def add_workers(parser: argparse.ArgumentParser, above_one: str) -> None:
    """`--workers` (what a value above 1 measures: `above_one`) and the Redis it needs."""
    shown = " (default %(default)s)"
    parser.add_argument(
        "--workers", type=positive(int), default=1, help=f"above 1: {above_one}" + shown
    )
    parser.add_argument("--redis-url", default=REDIS_URL, help="Redis for --workers" + shown)


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def add_sized(
    parser: argparse.ArgumentParser,
    sized: Mapping[str, tuple[Callable[[str], float], str]],
    full: Mapping[str, float],
    quick: Mapping[str, float],
) -> None:
    """Size flags whose default depends on --quick; given explicitly, they win."""
    for name, (kind, what) in sized.items():
        parser.add_argument(
            f"--{name}",
            type=positive(kind),
            help=f"{what} (default {full[name]:g}; {quick[name]:g} with --quick)",
        )


def sized_values(
    args: argparse.Namespace, sized: Mapping[str, object], defaults: Mapping[str, float]
) -> dict[str, float]:
    return {name: getattr(args, name) or defaults[name] for name in sized}


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where available: a lighter client leaves more of the shared cores to the rest."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
