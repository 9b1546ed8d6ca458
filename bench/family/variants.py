"""A seeded family of traffic variants, so a policy is judged over shapes nobody tuned for.

A variant fixes everything relative (overload factor, tenants, their weights and shares,
arrival kinds, request shapes, backend batch, a slowdown); the absolute rates follow from
the capacity measured for it in the same run, so the same variant overloads a fast and a
slow machine alike. `scenario` renders a variant as an ordinary scenario file, which
`sluicegate bench run` replays alone.

The gateway config is the same for every variant: the lane settings of
docs/configuration.md's example (a 2 s TTFT promise, a 10 s queue age, a batch lane below,
VTC fairness, a pool sized to the backend's batch, the vLLM metrics gate). Nothing about a
variant may narrow it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal

from sluicegate.bench.arrivals import Burst, Closed, Poisson
from sluicegate.bench.dists import Uniform
from sluicegate.bench.retry import Backoff, Immediate, NoRetry, Retry
from sluicegate.bench.scenario import Event, Flow, Scenario, Slo, Tenant
from sluicegate.sim.engine import EngineSettings

OVERLOAD = (1.5, 4.0)
TENANTS = (2, 10)
CALLER_RATIO = (1.0, 10.0)
PROMPT_TOKENS = (64, 4000)
OUTPUT_TOKENS = (16, 1000)
BATCH = (8, 64)
SLOWDOWN = (1.5, 3.0)
SLOWDOWN_SHARE = 0.5
"""Of the variants, about this many slow the backend down mid-run."""
WEIGHTS = (1, 1, 2, 4)
ARRIVALS = ("poisson", "burst", "closed")
RETRIES = ("none", "immediate", "backoff")
SHAPE_SPREAD = 1.5
"""A tenant's lengths are uniform in [median / 1.5, median x 1.5], clipped to the ranges."""
THINK_S = (0.5, 3.0)
BURST_EVERY_S = (4.0, 12.0)
TIMEOUT_S = 15.0
"""Clients give up at 15 s, as in the issue's examples (longer for long answers)."""
MAX_ATTEMPTS = 3
KV_TOKENS_PER_SEQ = PROMPT_TOKENS[1] + OUTPUT_TOKENS[1]
"""The backend's KV cache holds a full batch of the longest requests: the batch, not the
cache, is the backend's limit, as the variant says."""
PROMISE_S = 2.0
MAX_QUEUE_AGE_S = 10.0
LANE = "interactive"
BATCH_LANE = "batch"
MODEL = "sim-model"

Kind = Literal["poisson", "burst", "closed"]
RetryKind = Literal["none", "immediate", "backoff"]


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    weight: int
    arrival: Kind
    share: float
    """This tenant's part of the variant's offered requests; the shares sum to 1."""
    prompt_median: int
    output_median: int
    think_s: float
    """Closed loops: mean pause between a caller's answer and its next request."""
    burst_every_s: float
    """Bursts: seconds between two bursts."""

    def prompt(self) -> Uniform:
        return _spread(self.prompt_median, PROMPT_TOKENS)

    def output(self) -> Uniform:
        return _spread(self.output_median, OUTPUT_TOKENS)


@dataclass(frozen=True, slots=True)
class Variant:
    seed: int
    index: int
    overload: float
    batch: int
    retry: RetryKind
    tenants: tuple[TenantSpec, ...]
    slowdown: float | None
    slowdown_at: float
    """Fraction of the run's duration at which the slowdown starts (if any)."""

    @property
    def name(self) -> str:
        return f"family-s{self.seed}-v{self.index}"

    @property
    def caller_ratio(self) -> float:
        shares = [tenant.share for tenant in self.tenants]
        return max(shares) / min(shares)

    def sim(self) -> dict[str, str | int | float | bool]:
        settings = self.engine()
        return {
            "max_num_seqs": settings.max_num_seqs,
            "kv_cache_tokens": settings.kv_cache_tokens,
            "prefix_caching": settings.prefix_caching,
        }

    def engine(self) -> EngineSettings:
        return engine(self.batch)

    def mean_tokens(self) -> tuple[float, float]:
        """Mean prompt and output tokens of the variant's requests, by share."""
        prompt = sum(t.share * (t.prompt().low + t.prompt().high) / 2 for t in self.tenants)
        output = sum(t.share * (t.output().low + t.output().high) / 2 for t in self.tenants)
        return prompt, output

    def timeout_s(self) -> float:
        """15 s, or longer where the longest answer takes longer than that to decode in a
        full batch (slowed down): a client that gives up before any answer could finish
        would measure its own impatience, not the gateway."""
        settings = self.engine()
        full_step_s = settings.step_base_s + settings.step_per_seq_s * self.batch
        longest = max(tenant.output().high for tenant in self.tenants)
        decode_s = longest * full_step_s * (self.slowdown or 1.0)
        return max(TIMEOUT_S, float(math.ceil(2 * PROMISE_S + 1.5 * decode_s)))

    def describe(self) -> str:
        kinds = ",".join(sorted({tenant.arrival for tenant in self.tenants}))
        slow = f", {self.slowdown:.2f}x slowdown" if self.slowdown else ""
        return (
            f"{self.overload:.2f}x capacity, {len(self.tenants)} tenants ({kinds}), "
            f"callers 1:{self.caller_ratio:.1f}, batch {self.batch}, retry {self.retry}{slow}"
        )


def engine(batch: int) -> EngineSettings:
    """The simulator's settings for a variant's batch, with vLLM's default prefix caching
    (every request's prompt is its own, so only a request's own blocks are found)."""
    return EngineSettings(
        max_num_seqs=batch, kv_cache_tokens=batch * KV_TOKENS_PER_SEQ, prefix_caching=True
    )


def generate(seed: int, index: int) -> Variant:
    """Variant `index` of family `seed`: the same pair always gives the same variant."""
    rng = random.Random(f"sluicegate-family:{seed}:{index}")
    count = rng.randint(*TENANTS)
    ratio = math.exp(rng.uniform(0.0, math.log(CALLER_RATIO[1])))
    tenants = tuple(
        _tenant(rng, f"t{number + 1}", part)
        for number, part in enumerate(_parts(rng, count, ratio))
    )
    slowed = rng.random() < SLOWDOWN_SHARE
    return Variant(
        seed=seed,
        index=index,
        overload=rng.uniform(*OVERLOAD),
        batch=round(math.exp(rng.uniform(math.log(BATCH[0]), math.log(BATCH[1])))),
        retry=rng.choice(RETRIES),
        tenants=tenants,
        slowdown=rng.uniform(*SLOWDOWN) if slowed else None,
        slowdown_at=rng.uniform(0.35, 0.5),
    )


def _parts(rng: random.Random, count: int, ratio: float) -> list[float]:
    """`count` shares from 1 to `ratio` (the extremes always present), summing to 1."""
    raw = [1.0, ratio, *(math.exp(rng.uniform(0.0, math.log(ratio))) for _ in range(count - 2))]
    rng.shuffle(raw)
    total = sum(raw)
    return [value / total for value in raw]


def _tenant(rng: random.Random, name: str, share: float) -> TenantSpec:
    return TenantSpec(
        name=name,
        weight=rng.choice(WEIGHTS),
        arrival=rng.choice(ARRIVALS),
        share=share,
        prompt_median=_log_uniform(rng, PROMPT_TOKENS),
        output_median=_log_uniform(rng, OUTPUT_TOKENS),
        think_s=rng.uniform(*THINK_S),
        burst_every_s=rng.uniform(*BURST_EVERY_S),
    )


def _log_uniform(rng: random.Random, bounds: tuple[int, int]) -> int:
    return round(math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1]))))


def _spread(median: int, bounds: tuple[int, int]) -> Uniform:
    low = max(bounds[0], round(median / SHAPE_SPREAD))
    high = min(bounds[1], round(median * SHAPE_SPREAD))
    return Uniform(dist="uniform", low=low, high=max(low, high))


def probe(variant: Variant, rate: float, duration_s: float, drain_s: float) -> Scenario:
    """The variant's request shapes as Poisson arrivals at `rate` in total, each tenant's
    shape in proportion to its share: what capacity is measured with, backend alone."""
    flows = [
        _flow(
            tenant,
            Poisson(kind="poisson", rate=rate * tenant.share),
            NoRetry(policy="none"),
            variant.timeout_s(),
        )
        for tenant in variant.tenants
    ]
    return _scenario(variant, f"{variant.name}-probe", flows, duration_s, drain_s, None, [])


def scenario(
    variant: Variant,
    capacity_rps: float,
    service_s: float,
    duration_s: float,
    drain_s: float,
) -> Scenario:
    """The variant's traffic at `overload` x `capacity_rps`. A closed loop gets as many
    callers as keep that rate busy when each request takes `service_s` plus thinking."""
    total = variant.overload * capacity_rps
    flows = []
    for tenant in variant.tenants:
        rate = total * tenant.share
        arrival = _arrival(tenant, rate, service_s, duration_s)
        flows.append(_flow(tenant, arrival, _retry(variant.retry), variant.timeout_s()))
    events = []
    if variant.slowdown is not None:
        at = variant.slowdown_at * duration_s
        events.append(Event(at_s=at, faults={"slowdown": variant.slowdown}))
    return _scenario(variant, variant.name, flows, duration_s, drain_s, capacity_rps, events)


def _arrival(
    tenant: TenantSpec, rate: float, service_s: float, duration_s: float
) -> Poisson | Burst | Closed:
    if tenant.arrival == "poisson":
        return Poisson(kind="poisson", rate=rate)
    if tenant.arrival == "burst":
        every = min(tenant.burst_every_s, duration_s / 2)
        at = [step * every for step in range(math.ceil(duration_s / every))]
        return Burst(kind="burst", count=max(1, round(rate * every)), at_s=at)
    think = Uniform(dist="uniform", low=tenant.think_s / 2, high=tenant.think_s * 1.5)
    clients = max(1, round(rate * (tenant.think_s + service_s)))
    return Closed(kind="closed", clients=clients, think_s=think)


def _retry(kind: RetryKind) -> Retry:
    if kind == "immediate":
        return Immediate(policy="immediate", max_attempts=MAX_ATTEMPTS)
    if kind == "backoff":
        return Backoff(policy="backoff", max_attempts=MAX_ATTEMPTS, base_s=0.25, cap_s=4)
    return NoRetry(policy="none")


def _flow(
    tenant: TenantSpec, arrival: Poisson | Burst | Closed, retry: Retry, timeout_s: float
) -> Flow:
    return Flow(
        tenant=tenant.name,
        lane=LANE,
        arrival=arrival,
        prompt_tokens=tenant.prompt(),
        output_tokens=tenant.output(),
        stream=True,
        timeout_s=timeout_s,
        retry=retry,
    )


def _scenario(
    variant: Variant,
    name: str,
    flows: list[Flow],
    duration_s: float,
    drain_s: float,
    capacity_rps: float | None,
    events: list[Event],
) -> Scenario:
    return Scenario(
        name=name,
        description=variant.describe(),
        duration_s=duration_s,
        drain_s=drain_s,
        seed=variant.seed * 1000 + variant.index,
        capacity_rps=capacity_rps,
        sim=variant.sim(),
        gateway=gateway_config(variant),
        tenants=[Tenant(name=t.name, key_env=key_env(t.name)) for t in variant.tenants],
        lanes={LANE: Slo(ttft_s=PROMISE_S)},
        flows=flows,
        events=events,
    )


def key_env(tenant: str) -> str:
    return f"FAMILY_KEY_{tenant.upper()}"


def gateway_config(variant: Variant) -> dict[str, Any]:
    """docs/configuration.md's example lanes, whatever the variant: only the batch size and the
    tenants (names, weights) come from it. The deployment is declared `resumable`, as a
    vLLM one may be: the simulator continues a final assistant message and, like vLLM,
    keeps a prefix cache, so a slot handed over costs little prefill again."""
    return {
        "scheduling": {
            "fairness": "vtc",
            "lanes": [
                {
                    "name": LANE,
                    "priority": 100,
                    "ttft_slo_s": PROMISE_S,
                    "queue_size": 256,
                    "max_queue_age_s": MAX_QUEUE_AGE_S,
                    "max_backend_waiting": 2,
                },
                {
                    "name": BATCH_LANE,
                    "priority": 0,
                    "queue_size": 1000,
                    "max_queue_age_s": 600,
                    "max_backend_waiting": 0,
                },
            ],
        },
        "pools": [{"name": "sim", "max_concurrency": variant.batch}],
        "models": [
            {
                "name": MODEL,
                "deployments": [
                    {
                        "name": "sim",
                        "base_url": "${SLUICEGATE_SIM_URL}/v1",
                        "pools": ["sim"],
                        "metrics": {"interval_s": 0.25, "max_num_seqs": variant.batch},
                        "resumable": True,
                    }
                ],
            }
        ],
        "tenants": [
            {"name": t.name, "weight": t.weight, "keys": [{"env": key_env(t.name)}]}
            for t in variant.tenants
        ],
    }
