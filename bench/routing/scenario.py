"""A routing scenario: the replicas, the traffic and the phases that compare strategies.

Its own schema rather than `sluicegate bench run`'s: that harness starts one simulator
and sends prompts of a size, not of a text, while routing needs several replicas and
conversations whose every turn repeats the last. Parsed once and frozen, refused with
one line per problem naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from sluicegate.bench.scenario import load_as
from sluicegate.config.schema import Name, Strict

Strategy = Literal["round_robin", "least_loaded", "prefix_affinity", "fallback"]
Positive = Annotated[float, Field(gt=0)]
Count = Annotated[int, Field(ge=1)]


class Span(Strict):
    """A whole number drawn uniformly from `low` to `high`, both included."""

    low: Count
    high: Count

    @model_validator(mode="after")
    def _ordered(self) -> Span:
        if self.high < self.low:
            raise ValueError("high must be at least low")
        return self

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


class Traffic(Strict):
    """Conversations of applications that share a system prompt, and one-shot requests
    that share nothing; `one_shot_share` of the requests are the latter."""

    applications: Count = 12
    system_tokens: Count = 1500
    turns: Span = Span(low=2, high=6)
    user_tokens: Span = Span(low=300, high=600)
    think_s: Positive = 6.0
    """Mean pause (exponential) between an answer and the conversation's next turn."""
    one_shot_share: Annotated[float, Field(ge=0, le=1)] = 0.2
    one_shot_tokens: Span = Span(low=500, high=2000)
    output_tokens: Count = 32


class Tenant(Strict):
    name: Name
    weight: Positive = 1.0


class Phase(Strict):
    """One measured stretch on fresh processes: a strategy on `gateways` gateway
    replicas, the scenario's traffic or one-shot requests alone (`shared: false`), on
    the scenario's replicas or on equal ones of the same total capacity."""

    strategy: Strategy
    gateways: Annotated[int, Field(ge=1, le=4)] = 1
    shared: bool = True
    equal: bool = False
    prefix_affinity: dict[str, int | float] = Field(default_factory=dict)
    """Over the scenario's `prefix_affinity`, for this phase alone."""
    label: str | None = None

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        parts = [self.strategy]
        if self.gateways > 1:
            parts.append(f"{self.gateways}gw")
        if not self.shared:
            parts.append("unshared")
        if self.equal:
            parts.append("equal")
        return "-".join(parts)


class Probe(Strict):
    """How capacity is measured before the phases: `round_robin` over every replica, or
    `one_replica` (an unslowed replica alone, times the replicas' summed speeds)."""

    kind: Literal["round_robin", "one_replica"] = "round_robin"
    duration_s: Positive = 30.0
    warmup_s: Annotated[float, Field(ge=0)] = 5.0
    clients_per_slot: Positive = 2.0
    """Closed-loop clients per batch slot of the replicas probed."""


class RoutingScenario(Strict):
    name: Name
    description: str = ""
    seed: int | None = None
    """None: drawn when the run starts, and printed."""
    replicas: Annotated[int, Field(ge=1, le=8)] = 4
    sim: dict[str, str | int | float | bool] = Field(default_factory=dict)
    slowdown: list[Positive] = Field(default_factory=list)
    """Per replica, its step-time factor; missing ones are 1."""
    tenants: list[Tenant] = Field(min_length=1)
    traffic: Traffic = Traffic()
    load: Annotated[float, Field(gt=0, le=2)] = 0.7
    probe: Probe = Probe()
    duration_s: Positive = 60.0
    drain_s: Positive = 30.0
    max_backend_waiting: Annotated[int, Field(ge=0)] = 2
    metrics_interval_s: Positive = 0.25
    scrape_s: Positive = 0.5
    prefix_affinity: dict[str, int | float] = Field(default_factory=dict)
    phases: list[Phase] = Field(min_length=1)

    @model_validator(mode="after")
    def _shapes(self) -> RoutingScenario:
        if len(self.slowdown) > self.replicas:
            raise ValueError("slowdown: more entries than replicas")
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: names must be unique")
        return self

    def slowdowns(self, equal: bool = False) -> list[float]:
        """Each replica's step-time factor; `equal`: every replica alike, their summed
        speed (1 / factor) that of the scenario's."""
        given = [*self.slowdown, *[1.0] * (self.replicas - len(self.slowdown))]
        if not equal:
            return given
        speed = sum(1 / factor for factor in given)
        return [self.replicas / speed] * self.replicas

    @property
    def max_num_seqs(self) -> int:
        return int(self.sim.get("max_num_seqs", 32))

    @property
    def kv_cache_tokens(self) -> int:
        return int(self.sim.get("kv_cache_tokens", 65_536))


def load(path: Path) -> RoutingScenario:
    return load_as(path, RoutingScenario)
