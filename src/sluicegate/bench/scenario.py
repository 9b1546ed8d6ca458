"""A scenario file: the services to start, who sends what and when, and each lane's SLOs.

Parsed once and frozen, like the gateway's config, and refused with one line per problem
naming the field, so a typo in a benchmark cannot silently measure something else.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator

from sluicegate.bench.arrivals import Arrival, Burst, Poisson
from sluicegate.bench.dists import Dist, Fixed
from sluicegate.bench.retry import NoRetry, Retry
from sluicegate.config.schema import Name, Strict

M = TypeVar("M", bound=BaseModel)

MAX_DURATION_S = 3600.0
Positive = Annotated[float, Field(gt=0)]
Seconds = Positive
Offset = Annotated[float, Field(ge=0)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
DEFAULT_METRICS = (
    "sluicegate_*queue*",
    "sluicegate_requests_in_flight",
    "sluicegate_pool_active_attempts",
    "sluicegate_overload_state",
    "sluicegate_overload_pressure",
    "sluicegate_dispatch_gate",
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
)
"""Gauges plotted over time; glob patterns, so queue gauges are found whatever their name."""


class ScenarioError(Exception):
    """A scenario file that cannot be run; each line names the file and the field."""


def _on_off(value: object) -> object:
    """YAML 1.1 reads a bare `on`/`off` as a boolean."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


Policy = Annotated[Literal["on", "off"], BeforeValidator(_on_off)]


class Slo(Strict):
    """A lane's targets; a request meets them only if it succeeded within every one set."""

    ttft_s: Seconds | None = None
    tpot_s: Seconds | None = None
    e2e_s: Seconds | None = None


class Tenant(Strict):
    name: Name
    key_env: EnvName = Field(description="the variable holding the tenant's API key")


class Flow(Strict):
    """One stream of requests from one tenant in one lane, all shaped alike."""

    tenant: str
    lane: str
    arrival: Arrival
    start_s: Offset = 0.0
    stop_s: Seconds | None = None
    prompt_tokens: Dist = Fixed(value=100)
    output_tokens: Dist = Fixed(value=64)
    stream: bool = True
    timeout_s: Seconds = 60.0
    retry: Retry = NoRetry(policy="none")

    @model_validator(mode="after")
    def _window(self) -> Flow:
        if self.stop_s is not None and self.stop_s <= self.start_s:
            raise ValueError("stop_s must be after start_s")
        return self

    def window(self, duration_s: float) -> tuple[float, float]:
        """Seconds of the run in which this flow sends, clipped to the run."""
        stop = duration_s if self.stop_s is None else min(self.stop_s, duration_s)
        return self.start_s, max(self.start_s, stop)


class Event(Strict):
    """At `at_s`, POST `faults` to the simulator's /sim/faults (e.g. `{down: true}`)."""

    at_s: Offset
    faults: dict[str, Any] = Field(min_length=1)


class Scenario(Strict):
    name: Name
    description: str = ""
    duration_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S)]
    drain_s: Annotated[float, Field(ge=0, le=MAX_DURATION_S)] = 30.0
    seed: int = 1
    policy: Policy = "on"
    model: str = "sim-model"
    capacity_rps: Positive | None = None
    sim: dict[str, str | int | float | bool] = Field(default_factory=dict)
    gateway: dict[str, Any] | None = None
    tenants: list[Tenant] = Field(min_length=1)
    lanes: dict[str, Slo] = Field(min_length=1)
    flows: list[Flow] = Field(min_length=1)
    events: list[Event] = Field(default_factory=list)
    metrics: list[str] = Field(default_factory=lambda: list(DEFAULT_METRICS))
    scrape_s: Seconds = 1.0
    connections: Annotated[int, Field(ge=1, le=60_000)] = 1024

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: names must be unique")
        for index, flow in enumerate(self.flows):
            if flow.tenant not in names:
                raise ValueError(f"flows[{index}].tenant: unknown tenant {flow.tenant!r}")
            if flow.lane not in self.lanes:
                raise ValueError(f"flows[{index}].lane: unknown lane {flow.lane!r}")
        for index, event in enumerate(self.events):
            if event.at_s >= self.duration_s:
                raise ValueError(f"events[{index}].at_s: must be before duration_s")
        self._check_keys()
        return self

    def _check_keys(self) -> None:
        """Every tenant's key must be one the embedded gateway config accepts."""
        if self.gateway is None:
            return
        accepted = {
            key.get("env")
            for tenant in self.gateway.get("tenants") or ()
            if isinstance(tenant, dict)
            for key in tenant.get("keys") or ()
            if isinstance(key, dict)
        }
        for index, tenant in enumerate(self.tenants):
            if tenant.key_env not in accepted:
                raise ValueError(
                    f"tenants[{index}].key_env: {tenant.key_env} is not a key env of any "
                    "tenant in gateway.tenants"
                )


def load(path: Path) -> Scenario:
    return load_as(path, Scenario)


def load_as(path: Path, model: type[M]) -> M:
    """The YAML file at `path` as a `model`; any fault is one `ScenarioError` line."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(describe(str(path), exc)) from None


def describe(source: str, exc: ValidationError) -> str:
    """One line per problem: `file: flows[0].arrival.poisson.rate: Input should be ...`."""
    lines = [f"{source}: invalid scenario"]
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"  {where.lstrip('.')}: {message}" if where else f"  {message}")
    return "\n".join(lines)


def compressed(scenario: Scenario, duration_s: float, drain_s: float) -> Scenario:
    """The same timeline squeezed into `duration_s`: rates kept, bursts shrunk alike."""
    factor = min(1.0, duration_s / scenario.duration_s)
    return scenario.model_copy(
        update={
            "duration_s": scenario.duration_s * factor,
            "drain_s": min(scenario.drain_s, drain_s),
            "flows": [_compressed_flow(flow, factor) for flow in scenario.flows],
            "events": [e.model_copy(update={"at_s": e.at_s * factor}) for e in scenario.events],
        }
    )


def rate_scaled(scenario: Scenario, factor: float) -> Scenario:
    """Every Poisson rate times `factor`: probe capacity with one scenario's shapes."""
    flows = [
        flow.model_copy(
            update={"arrival": flow.arrival.model_copy(update={"rate": flow.arrival.rate * factor})}
        )
        if isinstance(flow.arrival, Poisson)
        else flow
        for flow in scenario.flows
    ]
    return scenario.model_copy(update={"flows": flows})


def _compressed_flow(flow: Flow, factor: float) -> Flow:
    arrival = flow.arrival
    if isinstance(arrival, Burst):
        arrival = arrival.model_copy(
            update={
                "count": max(1, math.ceil(arrival.count * factor)),
                "at_s": [at * factor for at in arrival.at_s],
            }
        )
    stop_s = None if flow.stop_s is None else flow.stop_s * factor
    return flow.model_copy(
        update={"arrival": arrival, "start_s": flow.start_s * factor, "stop_s": stop_s}
    )
