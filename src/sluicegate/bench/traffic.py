"""Sends a scenario's flows on schedule, retries as each flow's clients would, records it all.

Arrivals stop at the scenario's duration; requests already sent are followed to their end
until the drain time runs out, when whatever is left is cancelled and recorded as such.
Every loop is bounded in count, and the whole run in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sluicegate.bench import client
from sluicegate.bench.arrivals import Closed, OpenLoop
from sluicegate.bench.dists import count
from sluicegate.bench.progress import Progress
from sluicegate.bench.records import UNFINISHED, Attempt, Record
from sluicegate.bench.retry import MAX_ATTEMPTS
from sluicegate.bench.scenario import Flow, Scenario
from sluicegate.bench.scrape import Scraper, outcomes

MAX_REQUESTS_PER_CLIENT = 1_000_000
MONITOR_S = 0.5
MAX_MONITOR_TICKS = 100_000


@dataclass(frozen=True, slots=True)
class Target:
    """Where the traffic goes and what else the run may read or poke there."""

    base_url: str
    """OpenAI-compatible base URL, ending in /v1."""
    keys: Mapping[str, str]
    """Tenant name -> API key."""
    label: str
    metrics: Mapping[str, str] = field(default_factory=dict)
    """Source name -> /metrics URL, scraped during the run."""
    sim_url: str | None = None
    """The simulator that scheduled events are posted to; None skips them."""
    check: Callable[[], None] = lambda: None
    """Raises when a process the run depends on went away."""
    gateway_config: Mapping[str, Any] | None = None
    """The config the run's own gateway ran, policy on or pass-through; None for a URL."""


@dataclass(frozen=True, slots=True)
class Run:
    records: list[Record]
    metrics: dict[str, dict[str, list[tuple[float, float]]]]
    events: list[dict[str, object]]
    notes: list[str]
    gateway_outcomes: dict[str, dict[str, float]] | None = None
    """The run's own gateway's count of finished requests by lane and kind, read at the
    end; None without one."""


class _Request:
    """A request in progress; what it has seen so far survives its cancellation."""

    __slots__ = ("asked", "attempts", "flow", "sending_since", "start_s")

    def __init__(self, flow: int, start_s: float) -> None:
        self.flow = flow
        self.start_s = start_s
        self.attempts: list[Attempt] = []
        self.sending_since: float | None = None
        self.asked = (0, 0)

    def record(self, flow: Flow, now_s: float) -> Record | None:
        attempts = list(self.attempts)
        if self.sending_since is not None:
            attempts.append(Attempt(self.sending_since, now_s, 0, UNFINISHED))
        if not attempts:
            return None
        return Record(
            flow.tenant,
            flow.lane,
            self.flow,
            flow.stream,
            self.start_s,
            tuple(attempts),
            *self.asked,
        )


class Traffic:
    def __init__(self, scenario: Scenario, target: Target, session: aiohttp.ClientSession) -> None:
        self._scenario = scenario
        self._target = target
        self._session = session
        self._started = time.perf_counter()
        self._requests: list[_Request] = []
        self._live: set[asyncio.Task[None]] = set()
        self._succeeded = 0
        self._events: list[dict[str, object]] = []
        self._notes: list[str] = []
        self._scraper = Scraper(
            session, target.metrics, scenario.metrics, scenario.scrape_s, self.since
        )

    def since(self) -> float:
        return time.perf_counter() - self._started

    async def run(self) -> Run:
        """Stops early, raising, only when the monitor finds a process gone."""
        stop = asyncio.Event()
        monitor = asyncio.create_task(self._monitor(stop))
        scraper = asyncio.create_task(self._scraper.run(stop))
        fire = asyncio.create_task(self._fire())
        traffic = asyncio.create_task(self._traffic())
        try:
            await asyncio.wait({traffic, monitor}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.set()
            traffic.cancel()
            fire.cancel()
            await asyncio.wait({traffic, monitor, scraper, fire})
        failure = None if monitor.cancelled() else monitor.exception()
        if failure is not None:
            raise failure
        gateway = self._target.metrics.get("gateway")
        counted = None if gateway is None else await outcomes(self._session, gateway)
        return self._result(counted)

    def _result(self, counted: dict[str, dict[str, float]] | None) -> Run:
        now = self.since()
        flows = self._scenario.flows
        records = [r for q in self._requests if (r := q.record(flows[q.flow], now)) is not None]
        notes = self._notes + self._scraper.notes()
        return Run(records, dict(self._scraper.series), self._events, notes, counted)

    async def _traffic(self) -> None:
        sources = [asyncio.create_task(source) for source in self._sources()]
        scenario = self._scenario
        try:
            async with asyncio.timeout(scenario.duration_s + scenario.drain_s - self.since()):
                await asyncio.gather(*sources)
                if self._live:
                    await asyncio.wait(set(self._live))
        except TimeoutError:
            self._notes.append(f"{len(self._live)} requests unfinished when the drain time ended")
        finally:
            pending = [*sources, *self._live]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _sources(self) -> Iterator[Coroutine[Any, Any, None]]:
        keys = flow_keys(self._scenario.flows)
        for index, (flow, key) in enumerate(zip(self._scenario.flows, keys, strict=True)):
            arrival = flow.arrival
            if isinstance(arrival, Closed):
                for client_index in range(arrival.clients):
                    yield self._closed(index, flow, arrival, self._rng(*key, client_index))
            else:
                yield self._open(index, flow, arrival, self._rng(*key))

    def _rng(self, *at: str | int) -> random.Random:
        return random.Random(":".join(map(str, (self._scenario.seed, *at))))

    async def _open(self, index: int, flow: Flow, arrival: OpenLoop, rng: random.Random) -> None:
        start, stop = flow.window(self._scenario.duration_s)
        for offset in arrival.offsets(stop - start, rng):
            await self._sleep_until(start + offset)
            self._launch(index, flow, rng)

    async def _closed(self, index: int, flow: Flow, arrival: Closed, rng: random.Random) -> None:
        start, stop = flow.window(self._scenario.duration_s)
        await self._sleep_until(start)
        for _ in range(MAX_REQUESTS_PER_CLIENT):
            if self.since() >= stop:
                return
            await self._launch(index, flow, rng)
            await asyncio.sleep(arrival.think_s.sample(rng))

    def _launch(self, index: int, flow: Flow, rng: random.Random) -> asyncio.Task[None]:
        request = _Request(index, self.since())
        self._requests.append(request)
        task = asyncio.create_task(self._send(request, flow, rng))
        self._live.add(task)
        task.add_done_callback(self._live.discard)
        return task

    async def _send(self, request: _Request, flow: Flow, rng: random.Random) -> None:
        prompt_tokens = count(flow.prompt_tokens, rng)
        output_tokens = count(flow.output_tokens, rng)
        request.asked = (prompt_tokens, output_tokens)
        prepared = client.prepare(
            self._target.base_url,
            self._scenario.model,
            self._target.keys[flow.tenant],
            flow.lane,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            stream=flow.stream,
            timeout_s=flow.timeout_s,
        )
        for number in range(1, MAX_ATTEMPTS + 1):
            request.sending_since = self.since()
            attempt = await client.send(
                self._session,
                prepared,
                flow.timeout_s,
                self.since,
                retries=number - 1 if flow.retry.announces else 0,
            )
            request.sending_since = None
            request.attempts.append(attempt)
            delay_s = flow.retry.delay_s(number, attempt, rng)
            if delay_s is None:
                self._succeeded += attempt.ok
                return
            await asyncio.sleep(delay_s)

    async def _fire(self) -> None:
        """Post each scheduled fault change to the simulator at its time."""
        events = sorted(self._scenario.events, key=lambda event: event.at_s)
        if events and self._target.sim_url is None:
            self._notes.append("events skipped: no simulator to send them to (--sim)")
            return
        for event in events:
            await self._sleep_until(event.at_s)
            sent_s = self.since()
            try:
                url = f"{self._target.sim_url}/sim/faults"
                async with self._session.post(url, json=event.faults) as response:
                    outcome = f"{response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcome = type(exc).__name__
            self._events.append({"at_s": sent_s, "faults": event.faults, "answer": outcome})
            if outcome != "200":
                self._notes.append(f"event at {event.at_s:g} s {event.faults} failed: {outcome}")

    async def _monitor(self, stop: asyncio.Event) -> None:
        """Draw the progress bar and check the processes, until the traffic has ended."""
        bar = Progress(self._scenario.duration_s)
        try:
            for _ in range(MAX_MONITOR_TICKS):
                self._target.check()
                bar.draw(self.since(), self._status())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), MONITOR_S)
                if stop.is_set():
                    return
        finally:
            bar.close(self.since(), self._status())

    def _status(self) -> str:
        return f"sent {len(self._requests)}  open {len(self._live)}  ok {self._succeeded}"

    async def _sleep_until(self, at_s: float) -> None:
        await asyncio.sleep(max(0.0, at_s - self.since()))


def flow_keys(flows: Sequence[Flow]) -> list[tuple[str, int]]:
    """What seeds each flow's RNG: its tenant and its rank among that tenant's flows,
    not its position in the file, so a scenario that adds or drops another tenant's
    flow (an idle baseline) replays the same traffic for the rest."""
    ranks: Counter[str] = Counter()
    keys = []
    for flow in flows:
        keys.append((flow.tenant, ranks[flow.tenant]))
        ranks[flow.tenant] += 1
    return keys
