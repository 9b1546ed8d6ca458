"""Gates at the edge, cheapest first, each refusing at once (no hidden queue).

The tenant's concurrency is checked before the body is read; once the body is in, its
prompt estimate is held to the prompt budgets (`check_prompt`), then the route's and
the aggregate's concurrency (a slow body must not hold shared capacity) with the rates
and token quotas, in one decision. A body that came whole with its headers holds
nothing while it is read, so the tenant's slot then joins that decision. Each decision
is all-or-nothing in the limit store (one round trip to a shared one), and what it took
is handed to the caller's exit stack the moment it is taken, so it is given back (its
slots freed and its token reservations settled, in one store call) whatever happens to
the request.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass

from sluicegate.core import keys
from sluicegate.core.call import Call, Tally
from sluicegate.core.errors import GatewayError
from sluicegate.core.leases import Leases, store_unavailable
from sluicegate.core.limits import (
    Ask,
    Charge,
    Lease,
    Part,
    Refused,
    Slot,
    StoreUnavailable,
    priced,
    unspent,
)
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Endpoint, Quota, RoutePolicy, Tenant


@dataclass(frozen=True, slots=True)
class _Gate:
    """One slot or charge, with what to answer when it refuses."""

    reason: Refusal
    who: str
    is_tokens: bool = False


@dataclass(frozen=True, slots=True)
class _Quotas:
    """The decision once the body is in, built once per tenant, route and kind of work:
    the shared slots (answered by `slot_gates`) and the rates (by `gates`), whose token
    charges (at `tokens`) are priced per request."""

    ask: Ask
    slot_gates: tuple[_Gate, ...]
    gates: tuple[_Gate, ...]
    tokens: tuple[int, ...]


_Slots = tuple[Ask | None, tuple[_Gate, ...]]
"""One decision of the limit store (None: no limit to check) and what each slot answers."""


class Boundary:
    def __init__(
        self, leases: Leases, routes: Mapping[Endpoint, RoutePolicy], aggregate: Quota
    ) -> None:
        self._leases = leases
        self._routes = routes
        self._aggregate = aggregate
        self._tenant_slots: dict[str, _Slots] = {}
        self._quota_plans: dict[tuple[str, Endpoint, bool, bool], _Quotas] = {}

    async def enter_tenant(self, tenant: Tenant, permits: AsyncExitStack) -> None:
        """The tenant's concurrency slot, taken before the body is read: a body trickled
        in slowly holds only its own tenant's capacity. Jobs take it too."""
        gates = self._tenant_slots.get(tenant.name)
        if gates is None:
            gates = self._tenant_slots[tenant.name] = self._tenant_gates(tenant)
        await self._hold(gates, permits)

    async def _hold(self, gates: _Slots, permits: AsyncExitStack) -> None:
        wanted, named = gates
        if wanted is None:
            return
        try:
            decision = await self._leases.take(wanted)
        except StoreUnavailable:
            raise store_unavailable() from None
        if isinstance(decision, Refused):
            raise _full(wanted.slots[decision.index], named[decision.index])
        permits.push_async_callback(self._leases.give_back, decision)

    def _tenant_gates(self, tenant: Tenant) -> _Slots:
        limit = tenant.quota.max_concurrency
        if limit is None:
            return None, ()
        gate = _Gate(Refusal.TENANT_CONCURRENCY, f"tenant {tenant.name}")
        return Ask(slots=(Slot(keys.tenant_slots(tenant.name), limit),)), (gate,)

    def _shared_gates(self, endpoint: Endpoint) -> _Slots:
        """Built once per route, since the limits are fixed at start."""
        slots: list[tuple[Slot, _Gate]] = []
        route_limit = self._routes[endpoint].max_concurrency
        if route_limit is not None:
            who = f"route {endpoint.value}"
            slots.append((Slot(keys.route_slots(endpoint.value), route_limit), _capacity(who)))
        aggregate_limit = self._aggregate.max_concurrency
        if aggregate_limit is not None:
            slots.append((Slot(keys.AGGREGATE_SLOTS, aggregate_limit), _capacity("aggregate")))
        if not slots:
            return None, ()
        return Ask(slots=tuple(slot for slot, _ in slots)), tuple(gate for _, gate in slots)

    async def admit(
        self,
        call: Call,
        permits: AsyncExitStack,
        tally: Tally,
        shared: bool = True,
        tenant_slot: bool = False,
    ) -> None:
        """In one decision the route's and the aggregate's slots (`shared`: only
        interactive HTTP traffic takes them, since they protect the HTTP edge and jobs
        have their own bounds), the tenant's slot when `enter_tenant` did not take it
        (`tenant_slot`), and the request and token rates of the tenant and the
        aggregate."""
        key = (call.tenant.name, call.endpoint, shared, tenant_slot)
        plan = self._quota_plans.get(key)
        if plan is None:
            plan = self._quotas(call.tenant, call.endpoint, shared, tenant_slot)
            self._quota_plans[key] = plan
        if not plan.gates and not plan.slot_gates:
            return
        ask = plan.ask
        if plan.tokens:
            ask = Ask((), ask.slots, priced(ask.charges, plan.tokens, call.reserved_tokens))
        try:
            decision = await self._leases.take(ask)
        except StoreUnavailable:
            raise store_unavailable() from None
        if isinstance(decision, Refused):
            if decision.part is Part.SLOT:
                raise _full(ask.slots[decision.index], plan.slot_gates[decision.index])
            charge, gate = ask.charges[decision.index], plan.gates[decision.index]
            raise gate.reason.error(_rate_message(charge, gate), decision.retry_after_s)
        if ask.slots or plan.tokens:
            permits.push_async_callback(
                self._give_back, decision, ask.charges, plan.tokens, call.reserved_tokens, tally
            )

    def _quotas(
        self, tenant: Tenant, endpoint: Endpoint, shared: bool, tenant_slot: bool
    ) -> _Quotas:
        """The slots (the tenant's first, when asked, then the shared ones), and the
        tenant's and the aggregate's rates a request of this tenant is charged: one
        unit of each request rate, its token reservation of each token rate."""
        own, own_gates = self._tenant_gates(tenant) if tenant_slot else (None, ())
        slots, shared_gates = self._shared_gates(endpoint) if shared else (None, ())
        taken = tuple(slot for ask in (own, slots) if ask is not None for slot in ask.slots)
        slot_gates = own_gates + shared_gates
        plan = list(self._plan(tenant))
        gates = tuple(gate for _, gate in plan)
        tokens = tuple(i for i, gate in enumerate(gates) if gate.is_tokens)
        ask = Ask((), taken, tuple(charge for charge, _ in plan))
        return _Quotas(ask, slot_gates, gates, tokens)

    def _plan(self, tenant: Tenant) -> Iterator[tuple[Charge, _Gate]]:
        name = tenant.name
        quotas = (
            (
                f"tenant {name}",
                tenant.quota,
                (keys.tenant_requests(name), Refusal.TENANT_RATE),
                (keys.tenant_tokens(name), Refusal.TENANT_TOKENS),
            ),
            (
                "aggregate",
                self._aggregate,
                (keys.AGGREGATE_REQUESTS, Refusal.CAPACITY),
                (keys.AGGREGATE_TOKENS, Refusal.CAPACITY),
            ),
        )
        for who, quota, (requests_key, rate_reason), (tokens_key, token_reason) in quotas:
            if quota.requests is not None:
                yield Charge(requests_key, quota.requests, 1), _Gate(rate_reason, who)
            if quota.tokens is not None:
                yield Charge(tokens_key, quota.tokens, 0), _Gate(token_reason, who, True)

    async def _give_back(
        self,
        lease: Lease,
        charges: tuple[Charge, ...],
        tokens: tuple[int, ...],
        reserved: int,
        tally: Tally,
    ) -> None:
        """Free the shared slots and settle the token reservations against the usage
        reported, in one give-back."""
        await self._leases.give_back(lease, unspent(charges, tokens, reserved, tally.used_tokens))


def check_prompt(prompt: int, endpoint: Endpoint, route: RoutePolicy, tenant: Tenant) -> None:
    """The route's and the tenant's prompt budgets, held to the prompt as the caller sent
    it: checked before the overload ladder rewrites it, so no rewrite is spent on a
    request that was never admissible."""
    budget = route.max_prompt_tokens
    if budget is not None and prompt > budget:
        raise _too_long(prompt, f"the route {endpoint.value}", budget)
    budget = tenant.max_prompt_tokens
    if budget is not None and prompt > budget:
        raise _too_long(prompt, f"tenant {tenant.name}", budget)


def _too_long(prompt: int, who: str, budget: int) -> GatewayError:
    return Refusal.PROMPT_TOO_LONG.error(
        f"the prompt has about {prompt} tokens; {who} allows at most {budget}"
    )


def _full(slot: Slot, gate: _Gate) -> GatewayError:
    return gate.reason.error(f"{gate.who} is at its concurrency limit of {slot.limit}")


def _capacity(who: str) -> _Gate:
    return _Gate(Refusal.CAPACITY, who)


def _rate_message(charge: Charge, gate: _Gate) -> str:
    rate = charge.rate
    unit = "tokens" if gate.is_tokens else "requests"
    limit = f"{rate.limit:g} {unit} per {rate.period_s:g}s"
    if charge.cost > rate.burst:
        return f"the request needs {charge.cost:g} tokens, more than {gate.who}'s limit of {limit}"
    return f"{gate.who} is over its limit of {limit}"
