"""Interleaved measurement: each round of a phase runs one block per path and mode.

Alternating blocks (rather than single requests) lets the gateway's CPU be read around its
own blocks for one mode at a time, while drift on the shared cores still hits direct and
gateway, streaming and non-streaming alike.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from sluicegate.bench.loadgen import LoadGen, Request, Tally
from sluicegate.bench.procs import ProcessMeter

SERIAL = "serial"
POISSON = "poisson"
CLOSED = "closed"
MODES = ("non-streaming", "streaming")
RSS_INTERVAL_S = 0.2
MAX_RSS_SAMPLES = 3000
"""Ten minutes of samples: longer than any block, so the sampler is always cancelled first."""

Drive = Callable[[Request, Tally, int], Awaitable[None]]
P = TypeVar("P")


@dataclass(slots=True)
class GatewayUse:
    """What the gateway process spent during its own blocks, never during direct ones."""

    cpu_s: float = 0.0
    rss_peak_bytes: int = 0


@dataclass(slots=True)
class ModeRun:
    direct: Tally = field(default_factory=Tally)
    gateway: Tally = field(default_factory=Tally)
    use: GatewayUse = field(default_factory=GatewayUse)

    @property
    def cpu_per_request_ms(self) -> float:
        return 1000 * self.use.cpu_s / self.gateway.ok if self.gateway.ok else math.nan


PhaseRun = dict[str, ModeRun]
Block = tuple[Request, Tally, GatewayUse | None]


@dataclass(frozen=True, slots=True)
class Paths:
    """The same request addressed to the simulator directly and to the gateway."""

    direct: Request
    gateway: Request


def per_round(method: Callable[[Request, Tally, P], Awaitable[None]], params: Sequence[P]) -> Drive:
    """Adapt a load generator driver to a drive that takes its parameter for each round."""

    async def drive(request: Request, tally: Tally, index: int) -> None:
        await method(request, tally, params[index])

    return drive


def split(total: int, parts: int) -> list[int]:
    """`total` spread over `parts` as evenly as integers allow."""
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


class Bench:
    def __init__(
        self,
        meter: ProcessMeter,
        paths: Mapping[str, Paths],
        rounds: int,
        check: Callable[[], None],
    ) -> None:
        self._meter = meter
        self._paths = paths
        self._rounds = rounds
        self._check = check

    async def warm_up(self, gen: LoadGen, count: int) -> None:
        """Open the pools on both hops and warm caches; these samples are discarded."""
        for paths in self._paths.values():
            await gen.serial(paths.direct, Tally(), count)
            await gen.serial(paths.gateway, Tally(), count)
        self._check()

    async def phase(self, name: str, drive: Drive) -> PhaseRun:
        """Even rounds run the blocks in order, odd rounds in reverse, so order cancels out."""
        runs: PhaseRun = {mode: ModeRun() for mode in MODES}
        blocks = self._blocks(runs)
        _progress(f"{name}: {self._rounds} rounds of {len(blocks)} blocks")
        for index in range(self._rounds):
            for block in blocks if index % 2 == 0 else reversed(blocks):
                await self._run_block(drive, block, index)
            self._check()
        for mode, run in runs.items():
            _progress(f"{name} {mode}: {_summary(run)}")
        return runs

    def _blocks(self, runs: PhaseRun) -> list[Block]:
        """Per mode, a direct block and a gateway block; only the gateway's is metered."""
        blocks: list[Block] = []
        for mode, run in runs.items():
            blocks.append((self._paths[mode].direct, run.direct, None))
            blocks.append((self._paths[mode].gateway, run.gateway, run.use))
        return blocks

    async def _run_block(self, drive: Drive, block: Block, index: int) -> None:
        request, tally, use = block
        if use is None:
            await drive(request, tally, index)
            return
        async with self._metered(use):
            await drive(request, tally, index)

    @asynccontextmanager
    async def _metered(self, use: GatewayUse) -> AsyncIterator[None]:
        """Read the gateway's CPU around one block and sample its RSS while the block runs."""
        before = self._meter.cpu_s()
        sampler = asyncio.create_task(self._sample_rss(use))
        try:
            yield
        finally:
            sampler.cancel()
            await asyncio.wait({sampler})
        if not sampler.cancelled():
            sampler.result()
        use.cpu_s += self._meter.cpu_s() - before

    async def _sample_rss(self, use: GatewayUse) -> None:
        for _ in range(MAX_RSS_SAMPLES):
            use.rss_peak_bytes = max(use.rss_peak_bytes, self._meter.rss_bytes())
            await asyncio.sleep(RSS_INTERVAL_S)


def _summary(run: ModeRun) -> str:
    direct, gateway = run.direct, run.gateway
    return (
        f"direct {direct.ok} ok p50 {direct.percentile_ms(50):.3f} ms, "
        f"gateway {gateway.ok} ok p50 {gateway.percentile_ms(50):.3f} ms "
        f"cpu {run.cpu_per_request_ms:.3f} ms/req, "
        f"errors {direct.failed + gateway.failed}"
    )


def _progress(line: str) -> None:
    print(f"bench overhead: {line}", file=sys.stderr, flush=True)
