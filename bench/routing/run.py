"""One phase for real: fresh simulators (one per replica), one or more gateways in front
of them, the plan's requests streamed through, the backends' queues scraped.

Fresh processes per phase: each strategy starts with empty prefix caches and counters,
so the backends' own totals at the end are the phase's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.routing import plan as plans
from bench.routing.measure import Sent
from bench.routing.scenario import Phase, RoutingScenario, Traffic
from sluicegate.bench.procs import Child, service
from sluicegate.bench.stack import sim_flags

MODEL = "chat"
REQUEST_TIMEOUT_S = 180.0
REDIS_URL = "redis://127.0.0.1:6379/0"
WAITING = b"vllm:num_requests_waiting"


@dataclass(slots=True)
class Stack:
    sims: list[Child]
    gateways: list[Child]
    keys: dict[str, str]


@dataclass(slots=True)
class Outcome:
    records: list[Sent] = field(default_factory=list)
    waiting: dict[str, list[float]] = field(default_factory=dict)
    """Per replica, `vllm:num_requests_waiting` at each scrape."""
    working_set: list[int] = field(default_factory=list)
    """Characters of the live conversations' distinct prompts (system prompts once) at
    each scrape; a phase's working set is their mean past its first third, once the
    conversations begun at its start have grown."""
    backends: dict[str, dict[str, float]] = field(default_factory=dict)
    gateways: list[dict[str, float]] = field(default_factory=list)
    elapsed_s: float = 0.0


def gateway_config(
    scenario: RoutingScenario, sims: Sequence[Child], phase: Phase, redis_prefix: str | None
) -> dict[str, Any]:
    """Every replica a deployment of one model, read through its metrics; one lane whose
    gate holds requests at the gateway while a backend's queue is past its target."""
    deployments = [
        {
            "name": sim.name,
            "base_url": f"{sim.url}/v1",
            "model": "sim-model",
            "timeouts": {"read_s": REQUEST_TIMEOUT_S},
            "metrics": {"interval_s": scenario.metrics_interval_s, "stale_after_s": 2.0},
        }
        for sim in sims
    ]
    model: dict[str, Any] = {"name": MODEL, "strategy": phase.strategy, "deployments": deployments}
    affinity = {**scenario.prefix_affinity, **phase.prefix_affinity}
    if affinity:
        model["prefix_affinity"] = affinity
    config: dict[str, Any] = {
        "models": [model],
        "tenants": [
            {"name": t.name, "weight": t.weight, "keys": [{"env": f"ROUTING_KEY_{i}"}]}
            for i, t in enumerate(scenario.tenants)
        ],
        "scheduling": {
            "lanes": [
                {
                    "name": "chat",
                    "queue_size": 4096,
                    "max_queue_age_s": 120,
                    "max_backend_waiting": scenario.max_backend_waiting,
                }
            ]
        },
    }
    if redis_prefix is not None:
        config["store"] = "redis"
        config["redis"] = {"url": REDIS_URL, "key_prefix": redis_prefix}
    return config


@contextmanager
def started(
    scenario: RoutingScenario, phase: Phase, logs: Path, replicas: int | None = None
) -> Iterator[Stack]:
    """The phase's simulators and gateways; `replicas` overrides how many (a probe of one)."""
    logs.mkdir(parents=True, exist_ok=True)
    slowdowns = scenario.slowdowns(phase.equal)[: replicas or scenario.replicas]
    flags = sim_flags({**scenario.sim, "prefix_caching": True})
    keys = {t.name: f"sk-routing-{secrets.token_urlsafe(12)}" for t in scenario.tenants}
    env = {f"ROUTING_KEY_{i}": keys[t.name] for i, t in enumerate(scenario.tenants)}
    redis = f"routing-{secrets.token_hex(4)}:" if phase.gateways > 1 else None
    with ExitStack() as stack:
        sims = [
            stack.enter_context(
                service(f"replica-{i}", ["sim", *flags, "--slowdown", f"{s:g}"], "/health", logs)
            )
            for i, s in enumerate(slowdowns)
        ]
        path = logs / "gateway.yaml"
        path.write_text(yaml.safe_dump(gateway_config(scenario, sims, phase, redis)))
        serve = ["serve", "--config", str(path), "--log-level", "warning"]
        gateways = [
            stack.enter_context(service(f"gateway-{i}", serve, "/ready", logs, env))
            for i in range(phase.gateways)
        ]
        yield Stack(sims, gateways, keys)


class Driver:
    """Sends a plan (open loop) or keeps clients busy (closed loop) through a stack."""

    def __init__(
        self, scenario: RoutingScenario, stack: Stack, session: aiohttp.ClientSession, seed: int
    ) -> None:
        self._scenario = scenario
        self._stack = stack
        self._session = session
        self._pick = random.Random(f"{seed}/gateway")
        self._seen: set[int] = set()
        self._live: dict[int, tuple[int, int]] = {}
        self._next_id = 0
        self.outcome = Outcome(waiting={sim.name: [] for sim in stack.sims})
        self._began = 0.0

    def now(self) -> float:
        return time.monotonic() - self._began

    async def open_loop(self, plan: plans.Plan, duration_s: float, drain_s: float) -> Outcome:
        """Every conversation and one-shot request of `plan` at its time; a turn due
        after `duration_s` is not sent; what is unfinished `drain_s` later is cut."""
        self._began = time.monotonic()
        tasks = [
            asyncio.ensure_future(self._conversation(plan, c, duration_s))
            for c in plan.conversations
        ]
        tasks += [asyncio.ensure_future(self._one_shot(o)) for o in plan.one_shots]
        scraping = asyncio.ensure_future(self._scrape(plan))
        try:
            await asyncio.wait(tasks, timeout=duration_s + drain_s)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            scraping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraping
        self.outcome.elapsed_s = self.now()
        await self._totals()
        return self.outcome

    async def closed_loop(
        self, seed: int, traffic: Traffic, clients: int, duration_s: float
    ) -> Outcome:
        """`clients` clients, each sending its next request as soon as its last is answered:
        a conversation's turns back to back, one-shot requests in their share."""
        self._began = time.monotonic()
        base = plans.applications(seed, traffic, self._scenario.tenants)

        async def client(index: int) -> None:
            rng = random.Random(f"{seed}/probe/{index}")
            while self.now() < duration_s:
                if rng.random() < traffic.one_shot_share:
                    await self._one_shot(plans.one_shot(rng, traffic, self._scenario.tenants, 0))
                    continue
                c = plans.conversation(rng, traffic, base.owners, 0)
                await self._conversation(base, c, duration_s, think=False)

        tasks = [asyncio.ensure_future(client(i)) for i in range(clients)]
        try:
            await asyncio.wait(tasks, timeout=duration_s)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.outcome.elapsed_s = self.now()
        return self.outcome

    async def _conversation(
        self, plan: plans.Plan, c: plans.Conversation, duration_s: float, think: bool = True
    ) -> None:
        await self._until(c.start_s)
        ident = self._next_id
        self._next_id += 1
        system = plan.systems[c.application]
        answers: list[str] = []
        try:
            for turn in range(len(c.users)):
                if turn and think:
                    await asyncio.sleep(c.thinks_s[turn - 1])
                if self.now() >= duration_s:
                    return
                chat = plans.messages(system, c.users, answers)
                seen = c.application in self._seen
                self._seen.add(c.application)
                shared = plans.shared_chars(system, c.users, answers, seen)
                chars = sum(len(m["content"]) for m in chat)
                self._live[ident] = (c.application, chars - len(system))
                answer = await self._send(c.tenant, "turn", {"messages": chat}, chars, shared)
                if answer is None:
                    return
                answers.append(answer)
        finally:
            self._live.pop(ident, None)

    async def _one_shot(self, o: plans.OneShot) -> None:
        await self._until(o.start_s)
        body = {"messages": [{"role": "user", "content": o.text}]}
        await self._send(o.tenant, "one_shot", body, len(o.text), 0)

    async def _until(self, at_s: float) -> None:
        wait = at_s - self.now()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _send(
        self, tenant: str, kind: str, body: dict[str, Any], chars: int, shared: int
    ) -> str | None:
        """Stream one chat completion; its answer's text, or None when it failed."""
        gateways = self._stack.gateways
        gateway = gateways[self._pick.randrange(len(gateways))]
        payload = {
            **body,
            "model": MODEL,
            "max_tokens": self._scenario.traffic.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"Authorization": f"Bearer {self._stack.keys[tenant]}"}
        sent = self.now()
        first: float | None = None
        pieces: list[str] = []
        tokens = 0
        error: str | None = None
        try:
            async with self._session.post(
                f"{gateway.url}/v1/chat/completions", json=payload, headers=headers
            ) as response:
                if response.status != 200:
                    error = f"http {response.status}"
                else:
                    async for line in response.content:
                        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                            continue
                        event = orjson.loads(line[6:])
                        for choice in event.get("choices") or ():
                            content = (choice.get("delta") or {}).get("content")
                            if content:
                                if first is None:
                                    first = self.now()
                                pieces.append(content)
                        usage = event.get("usage")
                        if usage:
                            tokens = int(usage.get("completion_tokens") or 0)
        except asyncio.CancelledError:
            error = "cut"
            raise
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            error = type(exc).__name__
        finally:
            end = self.now()
            if error is None and first is None:
                error = "no tokens"
            self.outcome.records.append(
                Sent(tenant, kind, sent, first, end, tokens, error, chars, shared)
            )
        return "".join(pieces) if error is None else None

    async def _scrape(self, plan: plans.Plan) -> None:
        while True:
            await asyncio.sleep(self._scenario.scrape_s)
            apps = {app for app, _ in self._live.values()}
            self.outcome.working_set.append(
                sum(len(plan.systems[a]) for a in apps)
                + sum(chars for _, chars in self._live.values())
            )
            for sim in self._stack.sims:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with self._session.get(f"{sim.url}/metrics") as response:
                        text = await response.read()
                    self.outcome.waiting[sim.name].append(_gauge(text, WAITING))

    async def _totals(self) -> None:
        for sim in self._stack.sims:
            self.outcome.backends[sim.name] = await self._counters(f"{sim.url}/metrics")
        for gateway in self._stack.gateways:
            self.outcome.gateways.append(await self._counters(f"{gateway.url}/metrics"))

    async def _counters(self, url: str) -> dict[str, float]:
        """Every sample summed by name and, for placements, by reason."""
        async with self._session.get(url) as response:
            text = await response.text()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if name == "sluicegate_placements_total":
                    name = f"{name}/{sample.labels.get('reason')}"
                totals[name] = totals.get(name, 0.0) + sample.value
        return totals


def _gauge(text: bytes, name: bytes) -> float:
    """A gauge's value summed over its label sets, read from the lines that name it."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (b"{", b" "):
            total += float(line.rsplit(b" ", 1)[1])
    return total


def make_session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    )


def weights(scenario: RoutingScenario) -> Mapping[str, float]:
    return {t.name: t.weight for t in scenario.tenants}
