"""Gates at the edge, cheapest first, each refusing at once (no hidden queue).

Concurrency is checked before the body is read; rates and token quotas once the
body gave an estimate. Every slot and reservation is handed to the caller's exit
stack the moment it is taken, so it is released whatever happens to the request.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass

from sluicegate.core.call import Call, Tally
from sluicegate.core.limits import LimitStore, Rate
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Endpoint, Quota, RoutePolicy, Tenant

AGGREGATE = "aggregate"


@dataclass(frozen=True, slots=True)
class _Charge:
    key: str
    rate: Rate
    cost: float
    reason: Refusal
    who: str
    is_tokens: bool


class Boundary:
    def __init__(
        self, store: LimitStore, routes: Mapping[Endpoint, RoutePolicy], aggregate: Quota
    ) -> None:
        self._store = store
        self._routes = routes
        self._aggregate = aggregate

    async def enter(
        self, endpoint: Endpoint, tenant: Tenant, permits: AsyncExitStack, interactive: bool
    ) -> None:
        """Concurrency gates: the route, the tenant, then all tenants together. Work that
        is not interactive HTTP traffic (jobs) takes only the tenant's slot: the route's
        and the aggregate's protect the HTTP edge, and jobs have their own bounds."""
        if interactive:
            route_limit = self._routes[endpoint].max_concurrency
            await self._slot(permits, f"route:{endpoint.value}", route_limit, Refusal.CAPACITY)
        tenant_limit = tenant.quota.max_concurrency
        await self._slot(permits, f"tenant:{tenant.name}", tenant_limit, Refusal.TENANT_CONCURRENCY)
        if interactive:
            aggregate_limit = self._aggregate.max_concurrency
            await self._slot(permits, AGGREGATE, aggregate_limit, Refusal.CAPACITY)

    async def charge(self, call: Call, permits: AsyncExitStack, tally: Tally) -> None:
        """Prompt budgets, then request and token rates of the tenant and the aggregate."""
        self._check_prompt_budget(call)
        taken: list[_Charge] = []
        try:
            for charge in self._charges(call):
                decision = await self._store.consume(charge.key, charge.rate, charge.cost)
                if not decision.allowed:
                    raise charge.reason.error(_rate_message(charge), decision.retry_after_s)
                taken.append(charge)
        except BaseException:
            for charge in taken:
                await self._store.refund(charge.key, charge.rate, charge.cost)
            raise
        for charge in taken:
            if charge.is_tokens:
                permits.push_async_callback(self._settle, charge, tally)

    async def _slot(
        self, permits: AsyncExitStack, key: str, limit: int | None, reason: Refusal
    ) -> None:
        if limit is None:
            return
        if not await self._store.acquire(key, limit):
            raise reason.error(f"{key.replace(':', ' ')} is at its concurrency limit of {limit}")
        permits.push_async_callback(self._store.release, key)

    def _check_prompt_budget(self, call: Call) -> None:
        for who, budget in (
            (f"the route {call.endpoint.value}", call.route.max_prompt_tokens),
            (f"tenant {call.tenant.name}", call.tenant.max_prompt_tokens),
        ):
            if budget is not None and call.prompt_tokens > budget:
                raise Refusal.PROMPT_TOO_LONG.error(
                    f"the prompt has about {call.prompt_tokens} tokens; "
                    f"{who} allows at most {budget}"
                )

    def _charges(self, call: Call) -> Iterator[_Charge]:
        tenant = call.tenant
        quotas = (
            (f"tenant:{tenant.name}", tenant.quota, Refusal.TENANT_RATE, Refusal.TENANT_TOKENS),
            (AGGREGATE, self._aggregate, Refusal.CAPACITY, Refusal.CAPACITY),
        )
        for key, quota, rate_reason, token_reason in quotas:
            who = key.replace(":", " ")
            if quota.requests is not None:
                yield _Charge(f"{key}:requests", quota.requests, 1, rate_reason, who, False)
            if quota.tokens is not None:
                cost = call.reserved_tokens
                yield _Charge(f"{key}:tokens", quota.tokens, cost, token_reason, who, True)

    async def _settle(self, charge: _Charge, tally: Tally) -> None:
        """Reconcile a token reservation with the usage reported; unknown usage keeps it."""
        used = tally.used_tokens
        if used is not None and used != charge.cost:
            await self._store.refund(charge.key, charge.rate, charge.cost - used)


def _rate_message(charge: _Charge) -> str:
    rate = charge.rate
    unit = "tokens" if charge.is_tokens else "requests"
    limit = f"{rate.limit:g} {unit} per {rate.period_s:g}s"
    if charge.cost > rate.burst:
        return (
            f"the request needs {charge.cost:g} tokens, more than {charge.who}'s limit of {limit}"
        )
    return f"{charge.who} is over its limit of {limit}"
