"""Which lane a request joins: its tenant's or route's, or a lower one it asks for, then
the cost proxy.

A caller may move its own request down (the `X-Sluicegate-Lane` header), never up past
the lane it is configured for: priority is the operator's decision. A tenant whose config
lists `lanes` may ask for exactly those.

A request too costly for its lane (prompt budget or cost proxy) is demoted to the
lane's `demote_to` lane, or refused when the lane names none.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.core.errors import ErrorType, GatewayError, bad_request
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane, RoutePolicy, Scheduling, Tenant


@dataclass(frozen=True, slots=True)
class Demand:
    """What the admission estimate knows of a request before it runs."""

    prompt_tokens: int
    output_tokens: int
    uses_tools: bool


def cost(scheduling: Scheduling, demand: Demand) -> float:
    return (
        scheduling.cost_alpha * demand.prompt_tokens
        + scheduling.cost_beta * demand.output_tokens
        + scheduling.cost_gamma * (1.0 if demand.uses_tools else 0.0)
    )


def classify(
    scheduling: Scheduling,
    asked: str | None,
    tenant: Tenant,
    route: RoutePolicy,
    demand: Demand,
) -> Lane:
    own = _lane(scheduling, tenant.lane or route.lane or scheduling.default_lane)
    lane = own if asked is None else _lane(scheduling, asked)
    if not _may_ask(tenant, own, lane):
        raise _not_allowed(tenant, own, lane)
    price = cost(scheduling, demand)
    while not _fits(lane, demand, price):
        if lane.demote_to is None:
            raise _too_costly(lane, demand, price)
        demoted = scheduling.lane(lane.demote_to)
        assert demoted is not None, "config validation guarantees demotion targets"
        lane = demoted
    return lane


def _lane(scheduling: Scheduling, name: str) -> Lane:
    lane = scheduling.lane(name)
    if lane is None:
        raise bad_request(f"unknown lane {name!r}", "unknown_lane")
    return lane


def _may_ask(tenant: Tenant, own: Lane, asked: Lane) -> bool:
    if tenant.lanes is not None:
        return asked.name in tenant.lanes or asked is own
    return asked.priority <= own.priority


def _not_allowed(tenant: Tenant, own: Lane, asked: Lane) -> GatewayError:
    if tenant.lanes is not None:
        allowed = ", ".join(sorted(tenant.lanes | {own.name}))
        rule = f"it may use {allowed}"
    else:
        rule = f"it may use {own.name} or a lower-priority lane"
    return GatewayError(
        403,
        "lane_not_allowed",
        f"tenant {tenant.name} may not ask for lane {asked.name}; {rule}",
        ErrorType.PERMISSION,
        should_retry=False,
    )


def _fits(lane: Lane, demand: Demand, price: float) -> bool:
    if lane.max_prompt_tokens is not None and demand.prompt_tokens > lane.max_prompt_tokens:
        return False
    return lane.max_cost is None or price <= lane.max_cost


def _too_costly(lane: Lane, demand: Demand, price: float) -> Exception:
    if lane.max_prompt_tokens is not None and demand.prompt_tokens > lane.max_prompt_tokens:
        return Refusal.PROMPT_TOO_LONG.error(
            f"the prompt has about {demand.prompt_tokens} tokens; "
            f"lane {lane.name} allows at most {lane.max_prompt_tokens}"
        )
    return Refusal.TOO_COSTLY.error(
        f"the request's cost {price:g} is over lane {lane.name}'s limit of {lane.max_cost:g}"
    )
