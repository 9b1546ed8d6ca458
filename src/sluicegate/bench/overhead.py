"""`sluicegate bench overhead`: what the gateway adds in front of a zero-latency backend.

The load generator, the simulator and the gateway share this machine's cores, so wall-clock
differences are noisy; the main figure is the gateway's own CPU time per request. The run
always starts its own simulator and gateway on loopback and stops them, whatever happens.

With `--workers N` the run measures two gateways one after the other, each against its
own direct blocks: one worker, then `serve --workers N`, both on `store: redis` (a key
prefix of the run's own) so that the number of processes is the only difference; the
CPU of a layout is that of the supervisor and every worker together.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import sys
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from sluicegate.bench import report
from sluicegate.bench.args import add_sized, add_workers, loop_factory, positive, sized_values
from sluicegate.bench.loadgen import (
    LoadGen,
    Request,
    chat_request,
    make_session,
    poisson_arrivals,
)
from sluicegate.bench.phases import (
    CLOSED,
    MODES,
    POISSON,
    SERIAL,
    Bench,
    Paths,
    PhaseRun,
    per_round,
    split,
)
from sluicegate.bench.procs import (
    GATEWAY_MODEL,
    SIM_MODEL,
    ProcessMeter,
    ServiceError,
    Services,
    redis_store,
    services,
)

FULL = {"requests": 300, "warmup": 30, "duration": 8.0, "rounds": 4}
QUICK = {"requests": 100, "warmup": 10, "duration": 1.5, "rounds": 2}
DEFAULT_OUT = "bench/results/overhead.json"
SIZED = {
    "requests": (int, "serial requests per path and mode"),
    "warmup": (int, "discarded warm-up requests per path and mode"),
    "duration": (float, "seconds per path and mode of the Poisson and closed-loop phases"),
    "rounds": (int, "direct/gateway alternations per phase and mode"),
}
"""Sizes --quick shrinks; any of them given explicitly wins over either set."""


@dataclass(frozen=True, slots=True)
class Plan:
    requests: int
    warmup: int
    rate: float
    duration_s: float
    concurrency: int
    rounds: int
    max_tokens: int
    prompt_chars: int
    seed: int
    quick: bool
    out: Path

    @property
    def block_s(self) -> float:
        return self.duration_s / self.rounds

    @property
    def connections(self) -> int:
        """Room for every closed-loop worker plus Poisson bursts, so the pool never queues."""
        return max(64, 2 * self.concurrency)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED, FULL, QUICK)
    shown = " (default %(default)s)"
    add = parser.add_argument
    add("--rate", type=positive(float), default=100.0, help="Poisson req/s" + shown)
    add("--concurrency", type=positive(int), default=16, help="closed-loop workers" + shown)
    add("--max-tokens", type=positive(int), default=16, help="tokens per answer" + shown)
    add("--prompt-chars", type=positive(int), default=400, help="prompt characters" + shown)
    add("--seed", type=int, default=1, help="seed of the Poisson arrivals" + shown)
    add("--quick", action="store_true", help="a short run, for the smoke test")
    add("--out", type=Path, default=Path(DEFAULT_OUT), help="JSON results file" + shown)
    add_workers(parser, "measure one worker, then `serve --workers N`, both on Redis")


def run(args: argparse.Namespace) -> int:
    """0 once the run completed, targets met or not; 1 when a process failed or went away."""
    plan = _plan(args)
    layouts = [1] if args.workers == 1 else [1, args.workers]
    documents: dict[str, object] = {}
    try:
        for workers in layouts:
            with _services(args, workers) as started:
                runs = _run_async(plan, started)
            found = report.figures(runs)
            config = {**dataclasses.asdict(plan), "out": str(plan.out), "workers": workers}
            documents[f"{workers} workers"] = report.document(config, runs, found)
            if len(layouts) > 1:
                print(f"== {workers} worker(s), store: redis ==")
            print(report.text(runs, found))
    except ServiceError as exc:
        print(f"bench overhead: {exc}", file=sys.stderr)
        return 1
    report.write_json(plan.out, documents if len(layouts) > 1 else documents["1 workers"])
    print(f"bench overhead: results written to {plan.out}", file=sys.stderr)
    return 0


def _services(args: argparse.Namespace, workers: int) -> AbstractContextManager[Services]:
    """The memory store for a plain run; Redis for both layouts of a `--workers` run."""
    if args.workers == 1:
        return services()
    return services(
        extra_config=redis_store(args.redis_url), serve_args=["--workers", str(workers)]
    )


def _run_async(plan: Plan, started: Services) -> dict[str, PhaseRun]:
    """uvloop where available: a lighter client leaves more of the shared cores to the rest."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(_measure(plan, started))


async def _measure(plan: Plan, started: Services) -> dict[str, PhaseRun]:
    def check() -> None:
        started.sim.check_alive()
        started.gateway.check_alive()

    bench = Bench(
        ProcessMeter(started.gateway.popen.pid), _paths(plan, started), plan.rounds, check
    )
    rng = random.Random(plan.seed)
    arrivals = [poisson_arrivals(plan.rate, plan.block_s, rng) for _ in range(plan.rounds)]
    async with make_session(plan.connections) as session:
        gen = LoadGen(session, plan.concurrency)
        await bench.warm_up(gen, plan.warmup)
        serial = per_round(gen.serial, split(plan.requests, plan.rounds))
        poisson = per_round(gen.poisson, arrivals)
        closed = per_round(gen.closed, [plan.block_s] * plan.rounds)
        return {
            SERIAL: await bench.phase(SERIAL, serial),
            POISSON: await bench.phase(POISSON, poisson),
            CLOSED: await bench.phase(CLOSED, closed),
        }


def _paths(plan: Plan, started: Services) -> dict[str, Paths]:
    def request(url: str, model: str, stream: bool) -> Request:
        return chat_request(
            url,
            model,
            started.key,
            prompt_chars=plan.prompt_chars,
            max_tokens=plan.max_tokens,
            stream=stream,
        )

    return {
        mode: Paths(
            request(started.sim.url, SIM_MODEL, mode == "streaming"),
            request(started.gateway.url, GATEWAY_MODEL, mode == "streaming"),
        )
        for mode in MODES
    }


def _plan(args: argparse.Namespace) -> Plan:
    sizes = sized_values(args, SIZED, QUICK if args.quick else FULL)
    return Plan(
        requests=int(sizes["requests"]),
        warmup=int(sizes["warmup"]),
        rate=args.rate,
        duration_s=float(sizes["duration"]),
        concurrency=args.concurrency,
        rounds=int(sizes["rounds"]),
        max_tokens=args.max_tokens,
        prompt_chars=args.prompt_chars,
        seed=args.seed,
        quick=args.quick,
        out=args.out,
    )
