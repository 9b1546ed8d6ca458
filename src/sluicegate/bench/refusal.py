"""`sluicegate bench refusal`: what refusing excess work costs, at the client and in the gateway.

The bench tenant may run one request at a time and send one a minute. One request, admitted
and then hung by the simulator, takes both: while it is held every other request is refused
by the concurrency gate (before the body is read); once it is let go, by the rate gate (after
the body is parsed). Refused requests must never reach the simulator, so its `received`
counter has to equal the number of requests the gateway admitted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from sluicegate.bench import report
from sluicegate.bench.args import add_sized, add_workers, loop_factory, positive, sized_values
from sluicegate.bench.loadgen import LoadGen, Request, Tally, chat_request, make_session
from sluicegate.bench.phases import CLOSED, SERIAL
from sluicegate.bench.procs import (
    GATEWAY_MODEL,
    ProcessMeter,
    ServiceError,
    Services,
    redis_store,
    services,
)
from sluicegate.core.refusals import Refusal

FULL = {"requests": 2000, "warmup": 200, "duration": 5.0}
QUICK = {"requests": 200, "warmup": 20, "duration": 1.0}
SIZED = {
    "requests": (int, "serial requests per refusal kind"),
    "warmup": (int, "discarded warm-up requests per refusal kind"),
    "duration": (float, "seconds of the closed loop per refusal kind"),
}
"""Sizes --quick shrinks; any of them given explicitly wins over either set."""
DEFAULT_OUT = "bench/results/refusal.json"
TENANT_LIMITS = {"max_concurrency": 1, "requests_per_minute": 1}
PROMPT_CHARS = 400
MAX_TOKENS = 16
CLIENT_P99_MS = 2.0
CPU_PER_REFUSAL_MS = 1.0
HELD = 1
"""Requests the gateway admits on purpose: the one hung at the simulator."""
SETTLE_TIMEOUT_S = 10.0
SETTLE_POLL_S = 0.01
ADMITTED = "2xx admitted"
DEFINITIONS = {
    "client latency": "send to last response byte, measured by the client, refusals only",
    "gateway CPU per refusal": "gateway user+system CPU time (psutil) over the block, divided "
    "by the expected refusals in it (any other answer is charged to them too)",
    "refusals/s": "expected refusals over the closed loop's wall time",
    "refusals/CPU-s": "1 / CPU per refusal: the refusals one core of gateway CPU answers per "
    "second (with --workers N, the CPU of every worker and the supervisor together)",
    "reached simulator": "the simulator's `received` counter (every inference request it got) "
    "at the end; it must not exceed the requests the gateway admitted, the held one included",
    "unexpected answers": "answers in the measured blocks that were neither the kind's "
    "refusal (status, code, Retry-After or not) nor an admission",
    "cpu_resolution": report.DEFINITIONS["cpu_resolution"],
}


class SetupError(RuntimeError):
    """The refusals could not be arranged: the held request or a gate did not behave."""


@dataclass(frozen=True, slots=True)
class Kind:
    """One refusal the gateway should give; Retry-After is sent only when a time is known."""

    name: str
    refusal: Refusal
    retry_after: bool

    @property
    def outcome(self) -> str:
        return _outcome(self.refusal.status, self.refusal.value, self.retry_after)


CONCURRENCY = Kind("concurrency", Refusal.TENANT_CONCURRENCY, retry_after=False)
RATE = Kind("rate", Refusal.TENANT_RATE, retry_after=True)
KINDS = (CONCURRENCY, RATE)
"""In run order: the held request makes the first; letting it go leaves the second."""


@dataclass(frozen=True, slots=True)
class Plan:
    requests: int
    warmup: int
    duration_s: float
    concurrency: int
    quick: bool
    out: Path


@dataclass(slots=True)
class Block:
    """One measured run of a load driver, with the gateway CPU time spent during it."""

    tally: Tally = field(default_factory=Tally)
    cpu_s: float = 0.0

    @property
    def cpu_per_refusal_ms(self) -> float:
        return 1000 * self.cpu_s / self.tally.ok if self.tally.ok else math.nan


@dataclass(slots=True)
class KindRun:
    warmup: Tally = field(default_factory=Tally)
    blocks: dict[str, Block] = field(default_factory=lambda: {SERIAL: Block(), CLOSED: Block()})

    def tallies(self) -> Iterator[Tally]:
        yield self.warmup
        for block in self.blocks.values():
            yield block.tally

    def statuses(self, kind: Kind) -> Counter[str]:
        """Every answer this kind got, warm-up included: refusals are a tally's samples."""
        counts: Counter[str] = Counter()
        for tally in self.tallies():
            counts[kind.outcome] += tally.ok
            counts.update(tally.errors)
        return counts


@dataclass(frozen=True, slots=True)
class Result:
    runs: dict[str, KindRun]
    sim_stats: dict[str, int]

    @property
    def admitted(self) -> int:
        return HELD + sum(t.errors[ADMITTED] for run in self.runs.values() for t in run.tallies())

    @property
    def unexpected(self) -> int:
        """Measured answers that were neither the kind's refusal nor an admission."""
        return sum(
            block.tally.failed - block.tally.errors[ADMITTED]
            for run in self.runs.values()
            for block in run.blocks.values()
        )


class RefusalGen(LoadGen):
    """LoadGen's drivers, but a sample is one kind of refusal; every other answer is counted."""

    def __init__(self, session: aiohttp.ClientSession, workers: int, kind: Kind) -> None:
        super().__init__(session, workers)
        self.kind = kind

    async def one(self, request: Request, tally: Tally) -> None:
        started = time.perf_counter()
        try:
            async with self._session.post(
                request.url, data=request.body, headers=request.headers
            ) as response:
                body = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.errors[type(exc).__name__] += 1
            return
        latency_s = time.perf_counter() - started
        got = _answer(response, body)
        if got == self.kind.outcome:
            tally.latencies_s.append(latency_s)
        else:
            tally.errors[got] += 1

    async def settle(self, request: Request, tally: Tally) -> None:
        """Probe until the expected refusal comes back, e.g. after the held request let go."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        for _ in range(math.ceil(SETTLE_TIMEOUT_S / SETTLE_POLL_S)):
            refused = tally.ok
            await self.one(request, tally)
            if tally.ok > refused or time.monotonic() > deadline:
                break
            await asyncio.sleep(SETTLE_POLL_S)
        if not tally.ok:
            raise SetupError(f"no {self.kind.outcome} in {SETTLE_TIMEOUT_S:g} s: {tally.errors}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED, FULL, QUICK)
    shown = " (default %(default)s)"
    add = parser.add_argument
    add("--concurrency", type=positive(int), default=16, help="closed-loop workers" + shown)
    add("--quick", action="store_true", help="a short run, for the smoke test")
    add("--out", type=Path, default=Path(DEFAULT_OUT), help="JSON results file" + shown)
    add_workers(parser, "`serve --workers N` on Redis, whose limits every worker shares")


def run(args: argparse.Namespace) -> int:
    """0 once the run completed, targets met or not; 1 when a process or the setup failed."""
    plan = _plan(args)
    try:
        with (
            _services(args) as started,
            asyncio.Runner(loop_factory=loop_factory()) as runner,
        ):
            result = runner.run(_measure(plan, started))
    except (ServiceError, SetupError) as exc:
        print(f"bench refusal: {exc}", file=sys.stderr)
        return 1
    found = figures(result)
    config = {
        **dataclasses.asdict(plan),
        "out": str(plan.out),
        "tenant_limits": TENANT_LIMITS,
        "workers": args.workers,
    }
    report.write_json(plan.out, document(config, result, found))
    print(text(result, found))
    print(f"bench refusal: results written to {plan.out}", file=sys.stderr)
    return 0


def _services(args: argparse.Namespace) -> AbstractContextManager[Services]:
    if args.workers == 1:
        return services(TENANT_LIMITS)
    fleet = ["--workers", str(args.workers)]
    return services(TENANT_LIMITS, extra_config=redis_store(args.redis_url), serve_args=fleet)


async def _measure(plan: Plan, started: Services) -> Result:
    meter = ProcessMeter(started.gateway.popen.pid)
    request = chat_request(
        started.gateway.url,
        GATEWAY_MODEL,
        started.key,
        prompt_chars=PROMPT_CHARS,
        max_tokens=MAX_TOKENS,
        stream=False,
    )
    runs: dict[str, KindRun] = {}
    # Every closed-loop worker, the held request and the simulator queries at once.
    async with make_session(plan.concurrency + 2) as session:
        async with _held(session, started.sim.url, request):
            held = RefusalGen(session, plan.concurrency, CONCURRENCY)
            runs[CONCURRENCY.name] = await _measure_kind(plan, held, request, meter)
            _check(started)
        let_go = RefusalGen(session, plan.concurrency, RATE)
        runs[RATE.name] = await _measure_kind(plan, let_go, request, meter)
        _check(started)
        return Result(runs, await _sim_stats(session, started.sim.url))


def _check(started: Services) -> None:
    started.sim.check_alive()
    started.gateway.check_alive()


async def _measure_kind(
    plan: Plan, gen: RefusalGen, request: Request, meter: ProcessMeter
) -> KindRun:
    run = KindRun()
    await gen.settle(request, run.warmup)
    await gen.serial(request, run.warmup, plan.warmup)
    drives: dict[str, Callable[[Tally], Awaitable[None]]] = {
        SERIAL: lambda tally: gen.serial(request, tally, plan.requests),
        CLOSED: lambda tally: gen.closed(request, tally, plan.duration_s),
    }
    for phase, drive in drives.items():
        block = run.blocks[phase]
        before = meter.cpu_s()
        await drive(block.tally)
        block.cpu_s = meter.cpu_s() - before
        _progress(f"{gen.kind.name} {phase}: {_summary(block)}")
    return run


@asynccontextmanager
async def _held(
    session: aiohttp.ClientSession, sim_url: str, request: Request
) -> AsyncIterator[None]:
    """One request admitted, then hung by the simulator until let go: it holds the only slot.

    The gateway answers it (504) after its deployment's read timeout, 60 s by default; if
    that happens before the block ends, the concurrency figures are void and the run fails.
    """
    faults = f"{sim_url}/sim/faults"
    async with session.post(faults, json={"hang": True}) as response:
        response.raise_for_status()
    holder = asyncio.create_task(_hold(session, request))
    try:
        await _await_received(session, sim_url, holder)
        async with session.delete(faults) as response:
            response.raise_for_status()
        yield
        if holder.done():
            raise SetupError(
                f"the held request ended early ({holder.result()}), so the concurrency"
                " figures are void: a smaller --requests or --duration keeps it held"
            )
    finally:
        holder.cancel()
        await asyncio.wait({holder})


async def _hold(session: aiohttp.ClientSession, request: Request) -> str:
    """The held request's answer; no client timeout: being let go (cancelled) should end it."""
    try:
        async with session.post(
            request.url,
            data=request.body,
            headers=request.headers,
            timeout=aiohttp.ClientTimeout(total=None),
        ) as response:
            return _answer(response, await response.read())
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__


async def _await_received(
    session: aiohttp.ClientSession, sim_url: str, holder: asyncio.Task[str]
) -> None:
    """Wait until the simulator has the held request, so the hang fault can be cleared."""
    for _ in range(math.ceil(SETTLE_TIMEOUT_S / SETTLE_POLL_S)):
        if holder.done():
            raise SetupError(f"the held request was answered at once: {holder.result()}")
        if (await _sim_stats(session, sim_url))["received"] >= HELD:
            return
        await asyncio.sleep(SETTLE_POLL_S)
    raise SetupError(f"the held request did not reach the simulator in {SETTLE_TIMEOUT_S:g} s")


async def _sim_stats(session: aiohttp.ClientSession, sim_url: str) -> dict[str, int]:
    async with session.get(f"{sim_url}/sim/stats") as response:
        response.raise_for_status()
        stats: dict[str, int] = orjson.loads(await response.read())
        return stats


def _answer(response: aiohttp.ClientResponse, body: bytes) -> str:
    if 200 <= response.status < 300:
        return ADMITTED
    try:
        code = str(orjson.loads(body)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code = "unparsed body"
    return _outcome(response.status, code, "retry-after" in response.headers)


def _outcome(status: int, code: str, retry_after: bool) -> str:
    return f"{status} {code}" + (" +Retry-After" if retry_after else "")


def figures(result: Result) -> list[report.Figure]:
    """The issues' targets per kind, and the checks that refusals stayed at the boundary."""
    found: list[report.Figure] = []
    for name, run in result.runs.items():
        serial = run.blocks[SERIAL].tally
        p99 = serial.percentile_ms(99)
        found.append(report.Figure(f"{name} {SERIAL}", "client p99", p99, "ms", CLIENT_P99_MS))
        for phase, block in run.blocks.items():
            cpu_ms = block.cpu_per_refusal_ms
            found.append(
                report.Figure(
                    f"{name} {phase}", "gateway CPU / refusal", cpu_ms, "ms", CPU_PER_REFUSAL_MS
                )
            )
    received = result.sim_stats["received"]
    found.append(report.Figure("all", "reached simulator", received, "", result.admitted, digits=0))
    found.append(report.Figure("all", "unexpected answers", result.unexpected, "", 0, digits=0))
    return found


def text(result: Result, found: Sequence[report.Figure]) -> str:
    details = report.table(
        [
            "kind",
            "phase",
            "refusals",
            "other",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "refusals/s",
            "CPU ms/refusal",
            "refusals/CPU-s",
        ],
        [
            [
                name,
                phase,
                str(block.tally.ok),
                str(block.tally.failed),
                *(report.num(block.tally.percentile_ms(q)) for q in (50, 95, 99)),
                report.num(block.tally.throughput_rps, 0),
                report.num(block.cpu_per_refusal_ms),
                report.num(1000 / block.cpu_per_refusal_ms, 0),
            ]
            for name, run in result.runs.items()
            for phase, block in run.blocks.items()
        ],
        left=2,
    )
    answers = report.table(
        ["kind", "answer (warm-up included)", "count"],
        [
            [kind.name, answer, str(count)]
            for kind in KINDS
            for answer, count in result.runs[kind.name].statuses(kind).most_common()
        ],
        left=2,
    )
    targets = report.targets_table(found)
    notes = "\n".join(f"  {name}: {meaning}" for name, meaning in DEFINITIONS.items())
    admitted = f"admitted by the gateway: {result.admitted} (the held request included)"
    return f"{details}\n\n{answers}\n\n{targets}\n{admitted}\n\nDefinitions:\n{notes}\n"


def document(
    config: Mapping[str, object], result: Result, found: Sequence[report.Figure]
) -> dict[str, object]:
    return report.envelope(
        "refusal",
        config,
        DEFINITIONS,
        found,
        kinds={kind.name: _kind_json(kind, result.runs[kind.name]) for kind in KINDS},
        admitted=result.admitted,
        simulator=result.sim_stats,
        unexpected_answers=result.unexpected,
    )


def _kind_json(kind: Kind, run: KindRun) -> dict[str, object]:
    return {
        "expected": kind.outcome,
        "statuses": dict(run.statuses(kind)),
        **{phase: _block_json(block) for phase, block in run.blocks.items()},
    }


def _block_json(block: Block) -> dict[str, object]:
    tally = block.tally
    return {
        "refusals": tally.ok,
        "other": dict(tally.errors),
        **{f"p{q}_ms": tally.percentile_ms(q) for q in (50, 95, 99)},
        "elapsed_s": tally.elapsed_s,
        "refusals_per_s": tally.throughput_rps,
        "cpu_s": block.cpu_s,
        "cpu_per_refusal_ms": block.cpu_per_refusal_ms,
    }


def _summary(block: Block) -> str:
    tally = block.tally
    return (
        f"{tally.ok} refused, p99 {tally.percentile_ms(99):.3f} ms, "
        f"{tally.throughput_rps:.0f}/s, cpu {block.cpu_per_refusal_ms:.3f} ms/refusal, "
        f"other {dict(tally.errors)}"
    )


def _progress(line: str) -> None:
    print(f"bench refusal: {line}", file=sys.stderr, flush=True)


def _plan(args: argparse.Namespace) -> Plan:
    sizes = sized_values(args, SIZED, QUICK if args.quick else FULL)
    return Plan(
        requests=int(sizes["requests"]),
        warmup=int(sizes["warmup"]),
        duration_s=float(sizes["duration"]),
        concurrency=args.concurrency,
        quick=args.quick,
        out=args.out,
    )
