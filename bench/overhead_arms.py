"""`sluicegate bench overhead`'s phases with several gateways (arms) interleaved in blocks.

Each arm is a gateway run from its own `src` folder; the simulator and the load generator
are those of the checkout this script is run with (PYTHONPATH), so pointing PYTHONPATH at
a copy of one fixed commit keeps them the same whatever the arms change:

    git archive 3e71137 | tar -x -C /tmp/v/start
    PYTHONPATH=/tmp/v/start/src flock /tmp/sluicegate-bench.lock .venv/bin/python \\
        bench/overhead_arms.py --arm start=/tmp/v/start/src --arm now=src --blocks 5

Every arm's gateway runs the overhead benchmark's config against one shared zero-latency
simulator. A block runs, for each arm in turn (the order rotates from block to block),
the serial, Poisson and closed-loop phases, each with its own direct blocks beside the
gateway's, and reads the overhead benchmark's figures from them. Each figure is then
reported per arm as the median over the blocks, with the lowest and highest.

`--config NAME=FILE` serves that arm another config (bench/overhead/*.yaml: the same
model, tenant and key, with a feature configured). `--arm NAME=SRC@N` runs that arm
as `serve --workers N`; with any such arm, every arm's
gateway keeps its state in Redis (a key prefix of its own), so the number of processes
is the only difference between arms.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import secrets
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from sluicegate.bench import report
from sluicegate.bench.args import loop_factory
from sluicegate.bench.loadgen import LoadGen, Request, chat_request, make_session, poisson_arrivals
from sluicegate.bench.phases import CLOSED, MODES, POISSON, SERIAL, Bench, Paths, per_round
from sluicegate.bench.procs import (  # the load generator's checkout: its private config too
    _GATEWAY_CONFIG,
    GATEWAY_MODEL,
    KEY_ENV,
    SIM_MODEL,
    SIM_URL_ENV,
    Child,
    ProcessMeter,
    service,
)

CONFIG = _GATEWAY_CONFIG.replace("{limits}", "")
"""The overhead benchmark's own gateway config, as the load generator's checkout has it."""


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    src: Path
    workers: int
    config: str = CONFIG.format(
        model=GATEWAY_MODEL, sim_url_env=SIM_URL_ENV, sim_model=SIM_MODEL, key_env=KEY_ENV
    )


def arm(text: str) -> Arm:
    name, _, where = text.partition("=")
    src, _, workers = where.partition("@")
    if not name or not src:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=SRC[@WORKERS]")
    return Arm(name, Path(src).resolve(), int(workers or 1))


def configured(arms: list[Arm], configs: list[str]) -> list[Arm]:
    """`arms`, those named in `configs` (NAME=FILE) serving that file's config."""
    files = dict(text.split("=", 1) for text in configs)
    unknown = set(files) - {a.name for a in arms}
    if unknown:
        raise SystemExit(f"--config names no arm: {', '.join(sorted(unknown))}")
    return [
        dataclasses.replace(a, config=Path(files[a.name]).read_text()) if a.name in files else a
        for a in arms
    ]


@contextmanager
def gateways(arms: list[Arm], redis_url: str) -> Iterator[tuple[Child, dict[str, Child], str]]:
    """The simulator and one gateway per arm, all stopped at the end."""
    key = f"sk-bench-{secrets.token_urlsafe(16)}"
    fleet = any(a.workers > 1 for a in arms)
    with tempfile.TemporaryDirectory(prefix="sluicegate-arms-") as logs, ExitStack() as stack:
        folder = Path(logs)
        sim = stack.enter_context(service("sim", ["sim", "--time-scale", "0"], "/health", folder))
        started: dict[str, Child] = {}
        for a in arms:
            config = a.config
            if fleet:
                prefix = f"sluicegate-arms-{secrets.token_hex(4)}:"
                config += f"store: redis\nredis: {{url: {redis_url!r}, key_prefix: {prefix!r}}}\n"
            path = folder / f"{a.name}.yaml"
            path.write_text(config)
            serve = ["serve", "--config", str(path), "--log-level", "warning"]
            if a.workers > 1:
                serve += ["--workers", str(a.workers)]
            env = {"PYTHONPATH": str(a.src), KEY_ENV: key, SIM_URL_ENV: sim.url}
            started[a.name] = stack.enter_context(service(a.name, serve, "/ready", folder, env))
        yield sim, started, key


Values = dict[str, dict[tuple[str, str], list[float]]]


async def measure(
    args: argparse.Namespace, sim: Child, started: dict[str, Child], key: str
) -> tuple[Values, dict[tuple[str, str], str]]:
    rng = random.Random(args.seed)
    values: Values = defaultdict(lambda: defaultdict(list))
    units: dict[tuple[str, str], str] = {}
    names = list(started)
    async with make_session(max(64, 2 * args.concurrency)) as session:
        gen = LoadGen(session, args.concurrency)
        benches = {}
        for name, gateway in started.items():
            paths = {
                mode: Paths(
                    request(sim.url, SIM_MODEL, key, args, mode),
                    request(gateway.url, GATEWAY_MODEL, key, args, mode),
                )
                for mode in MODES
            }
            benches[name] = Bench(ProcessMeter(gateway.popen.pid), paths, 1, gateway.check_alive)
            await benches[name].warm_up(gen, args.warmup)
        for block in range(args.blocks):
            order = names[block % len(names) :] + names[: block % len(names)]
            for name in order:
                print(f"block {block + 1}/{args.blocks}: {name}", file=sys.stderr, flush=True)
                bench = benches[name]
                arrivals = [poisson_arrivals(args.rate, args.seconds, rng)]
                runs = {
                    SERIAL: await bench.phase(SERIAL, per_round(gen.serial, [args.requests])),
                    POISSON: await bench.phase(POISSON, per_round(gen.poisson, arrivals)),
                    CLOSED: await bench.phase(CLOSED, per_round(gen.closed, [args.seconds])),
                }
                for figure in report.figures(runs):
                    values[name][(figure.phase, figure.name)].append(figure.value)
                    units[(figure.phase, figure.name)] = figure.unit
    return values, units


def request(url: str, model: str, key: str, args: argparse.Namespace, mode: str) -> Request:
    return chat_request(
        url,
        model,
        key,
        prompt_chars=args.prompt_chars,
        max_tokens=args.max_tokens,
        stream=mode == "streaming",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--arm", type=arm, action="append", required=True, help="NAME=SRC[@WORKERS]")
    add("--config", action="append", default=[], help="NAME=FILE: that arm's config")
    add("--blocks", type=int, default=5, help="rounds over every arm (default 5)")
    add("--requests", type=int, default=200, help="serial requests per path and mode")
    add("--warmup", type=int, default=30, help="warm-up requests per path and mode")
    add("--seconds", type=float, default=2.0, help="Poisson and closed-loop block length")
    add("--rate", type=float, default=100.0, help="Poisson req/s")
    add("--concurrency", type=int, default=16, help="closed-loop workers")
    add("--max-tokens", type=int, default=16)
    add("--prompt-chars", type=int, default=400)
    add("--seed", type=int, default=None, help="Poisson arrivals (drawn and printed if not given)")
    add("--redis-url", default="redis://127.0.0.1:6379/0")
    add("--out", type=Path, help="JSON of every block's figures")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    print(f"seed {args.seed}", file=sys.stderr, flush=True)
    arms = configured(args.arm, args.config)
    with (
        gateways(arms, args.redis_url) as (sim, started, key),
        asyncio.Runner(loop_factory=loop_factory()) as runner,
    ):
        values, units = runner.run(measure(args, sim, started, key))
    names = [a.name for a in args.arm]
    print("| phase | figure | " + " | ".join(f"{n} median (min-max)" for n in names) + " |")
    print("| --- | --- |" + " --- |" * len(names))
    for key_ in units:
        cells = []
        for n in names:
            found = values[n][key_]
            cells.append(
                f"{statistics.median(found):.3f} ({min(found):.3f}-{max(found):.3f}) {units[key_]}"
            )
        print(f"| {key_[0]} | {key_[1]} | " + " | ".join(cells) + " |")
    if args.out:
        document = {
            "seed": args.seed,
            "arms": {a.name: {"src": str(a.src), "workers": a.workers} for a in args.arm},
            "blocks": {n: {f"{p}: {f}": v for (p, f), v in values[n].items()} for n in names},
        }
        args.out.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
