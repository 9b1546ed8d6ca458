from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from sluicegate.admission.boundary import Boundary, check_prompt
from sluicegate.core import keys
from sluicegate.core.call import Call, Tally
from sluicegate.core.errors import GatewayError
from sluicegate.core.leases import Leases
from sluicegate.core.limits import GiveBack, Rate
from sluicegate.core.types import Endpoint, Lane, Model, Quota, RoutePolicy, Tenant
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock
from tests.support.fakes import YieldingStore

MODEL = Model("m", ())
LANE = Lane("default")
DEFAULT_ROUTE = RoutePolicy()
NO_QUOTA = Quota()


def boundary(route=DEFAULT_ROUTE, aggregate=NO_QUOTA):
    clock = FakeClock()
    store = MemoryLimitStore(clock)
    return Boundary(Leases(store, clock), dict.fromkeys(Endpoint, route), aggregate), store


def call(tenant: Tenant, prompt: int = 10, reserved: int = 100, route=DEFAULT_ROUTE) -> Call:
    return Call(Endpoint.CHAT, tenant, MODEL, route, LANE, {}, False, 0.0, 60.0, prompt, reserved)


async def enter(
    gate: Boundary, endpoint: Endpoint, tenant: Tenant, permits: AsyncExitStack
) -> None:
    """The gates in the pipeline's order: the tenant's, then (once the body is in) the
    route's and the aggregate's with the rates."""
    await gate.enter_tenant(tenant, permits)
    await gate.admit(call(tenant)._replace(endpoint=endpoint), permits, Tally())


async def refusal(coro) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await coro
    return info.value


async def test_tenant_concurrency_is_429_without_retry_after_and_released_on_exit():
    gate, store = boundary()
    tenant = Tenant("a", None, Quota(max_concurrency=1))
    async with AsyncExitStack() as permits:
        await enter(gate, Endpoint.CHAT, tenant, permits)
        err = await refusal(enter(gate, Endpoint.CHAT, tenant, AsyncExitStack()))
        assert (err.status, err.code, err.retry_after_s) == (
            429,
            "tenant_concurrency_limited",
            None,
        )
    assert await store.in_use(keys.tenant_slots("a")) == 0


async def test_route_and_aggregate_concurrency_are_503():
    gate, store = boundary(RoutePolicy(max_concurrency=1), Quota(max_concurrency=5))
    async with AsyncExitStack() as permits:
        await enter(gate, Endpoint.CHAT, Tenant("a", None), permits)
        err = await refusal(enter(gate, Endpoint.CHAT, Tenant("b", None), AsyncExitStack()))
        assert (err.status, err.code) == (503, "capacity_exhausted")
        await enter(gate, Endpoint.EMBEDDINGS, Tenant("b", None), permits)
    assert await store.in_use(keys.AGGREGATE_SLOTS) == 0


async def test_a_refused_later_gate_leaves_no_earlier_slot_taken():
    gate, store = boundary(aggregate=Quota(max_concurrency=1))
    async with AsyncExitStack() as permits:
        await enter(gate, Endpoint.CHAT, Tenant("a", None, Quota(max_concurrency=3)), permits)
    async with AsyncExitStack() as held:
        await enter(gate, Endpoint.CHAT, Tenant("x", None), held)
        with pytest.raises(GatewayError):
            async with AsyncExitStack() as permits:
                await enter(
                    gate, Endpoint.CHAT, Tenant("a", None, Quota(max_concurrency=3)), permits
                )
        assert await store.in_use(keys.tenant_slots("a")) == 0


async def test_tenant_rate_is_429_with_the_windows_retry_after():
    gate, _ = boundary()
    tenant = Tenant("a", None, Quota(requests=Rate(2, 60, 2)))
    for _ in range(2):
        await gate.admit(call(tenant), AsyncExitStack(), Tally())
    err = await refusal(gate.admit(call(tenant), AsyncExitStack(), Tally()))
    assert (err.status, err.code, err.retry_after_s) == (
        429,
        "tenant_rate_limited",
        pytest.approx(30),
    )


async def test_token_quota_limits_by_tokens_not_by_requests_and_refunds_the_request():
    gate, store = boundary()
    tenant = Tenant("a", None, Quota(requests=Rate(100, 60, 100), tokens=Rate(1000, 60, 1000)))
    await gate.admit(call(tenant, reserved=900), AsyncExitStack(), Tally())
    err = await refusal(gate.admit(call(tenant, reserved=200), AsyncExitStack(), Tally()))
    assert err.code == "tenant_token_limited"
    assert err.retry_after_s == pytest.approx(6.0)
    assert await store.available(keys.tenant_requests("a"), Rate(100, 60, 100)) == pytest.approx(99)


async def test_token_reservation_is_settled_with_the_reported_usage():
    gate, store = boundary()
    rate = Rate(1000, 60, 1000)
    tenant = Tenant("a", None, Quota(tokens=rate))
    admitted = call(tenant, reserved=800)
    async with AsyncExitStack() as permits:
        tally = Tally()
        await gate.admit(admitted, permits, tally)
        assert await store.available(keys.tenant_tokens("a"), rate) == pytest.approx(200)
        tally.used_tokens = 50
    assert await store.available(keys.tenant_tokens("a"), rate) == pytest.approx(950)


async def test_aggregate_rate_is_503_even_when_each_tenant_is_within_its_own():
    gate, _ = boundary(aggregate=Quota(requests=Rate(3, 60, 3)))
    for name in "abc":
        await gate.admit(
            call(Tenant(name, None, Quota(requests=Rate(10, 60, 10)))), AsyncExitStack(), Tally()
        )
    err = await refusal(gate.admit(call(Tenant("d", None)), AsyncExitStack(), Tally()))
    assert (err.status, err.code) == (503, "capacity_exhausted")
    assert err.retry_after_s == pytest.approx(20)


def test_prompt_over_budget_is_400_naming_the_budget():
    with pytest.raises(GatewayError) as info:
        check_prompt(51, Endpoint.CHAT, DEFAULT_ROUTE, Tenant("a", None, max_prompt_tokens=50))
    err = info.value
    assert (err.status, err.code, err.should_retry) == (400, "prompt_too_long", False)
    assert "at most 50" in err.message
    with pytest.raises(GatewayError) as info:
        check_prompt(51, Endpoint.CHAT, RoutePolicy(max_prompt_tokens=40), Tenant("a", None))
    assert "route chat allows at most 40" in info.value.message
    check_prompt(40, Endpoint.CHAT, RoutePolicy(max_prompt_tokens=40), Tenant("a", None))


async def test_a_request_larger_than_the_whole_quota_is_not_worth_retrying():
    gate, _ = boundary()
    tenant = Tenant("a", None, Quota(tokens=Rate(1000, 60, 1000)))
    err = await refusal(gate.admit(call(tenant, reserved=5000), AsyncExitStack(), Tally()))
    assert err.should_retry is False
    assert err.retry_after_s is None
    assert "needs 5000 tokens" in err.message


async def test_only_the_tenants_slot_is_held_while_the_body_arrives():
    """A body trickled in holds its tenant's slot, not the route's or the aggregate's,
    which every tenant shares."""
    gate, store = boundary(route=RoutePolicy(max_concurrency=1), aggregate=Quota(max_concurrency=1))
    async with AsyncExitStack() as reading:
        await gate.enter_tenant(Tenant("slow", None, Quota(max_concurrency=5)), reading)
        assert await store.in_use(keys.tenant_slots("slow")) == 1
        async with AsyncExitStack() as permits:
            await enter(gate, Endpoint.CHAT, Tenant("b", None), permits)
            assert await store.in_use(keys.route_slots("chat")) == 1
            assert await store.in_use(keys.AGGREGATE_SLOTS) == 1


async def test_work_that_is_not_interactive_takes_only_the_tenants_slot():
    """Jobs are bound by their tenant's concurrency, not by the HTTP route's or the
    aggregate's, which guard interactive traffic."""
    gate, store = boundary(route=RoutePolicy(max_concurrency=1), aggregate=Quota(max_concurrency=1))
    tenant = Tenant("a", None, Quota(max_concurrency=2))
    async with AsyncExitStack() as permits:
        for _ in range(2):
            await gate.enter_tenant(tenant, permits)
            await gate.admit(call(tenant), permits, Tally(), shared=False)
        assert await store.in_use(keys.tenant_slots("a")) == 2
        assert await store.in_use(keys.route_slots("chat")) == 0
        assert await store.in_use(keys.AGGREGATE_SLOTS) == 0
        err = await refusal(gate.enter_tenant(tenant, AsyncExitStack()))
        assert err.code == "tenant_concurrency_limited"
    assert await store.in_use(keys.tenant_slots("a")) == 0


async def test_the_shared_slots_and_the_rates_are_one_decision():
    """One round trip once the body is in: a rate that refuses leaves the route's and
    the aggregate's slots untaken, and a full slot charges no rate."""
    gate, store = boundary(route=RoutePolicy(max_concurrency=1), aggregate=Quota(max_concurrency=5))
    tenant = Tenant("a", None, Quota(requests=Rate(1, 60, 1)))
    async with AsyncExitStack() as permits:
        await enter(gate, Endpoint.CHAT, tenant, permits)
        err = await refusal(enter(gate, Endpoint.CHAT, Tenant("b", None), AsyncExitStack()))
        assert err.code == "capacity_exhausted"
    err = await refusal(enter(gate, Endpoint.CHAT, tenant, AsyncExitStack()))
    assert err.code == "tenant_rate_limited"
    assert await store.in_use(keys.route_slots("chat")) == 0
    assert await store.in_use(keys.AGGREGATE_SLOTS) == 0


class Recording(MemoryLimitStore):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.given: list[list[GiveBack]] = []

    async def give_back(self, backs) -> None:
        self.given.append(list(backs))
        await super().give_back(backs)


async def test_a_request_gives_back_its_edge_slots_and_settles_its_tokens_in_one_store_call():
    """Each lease carries the refunds of its own decision's charges (so they apply once);
    on a networked store the request's two leases leave together."""
    clock = FakeClock()
    store = Recording(clock)
    leases = Leases(store, clock, detached=True)
    route = RoutePolicy(max_concurrency=4)
    rate = Rate(1000, 60, 1000)
    gate = Boundary(leases, dict.fromkeys(Endpoint, route), Quota(tokens=rate))
    tenant = Tenant("a", None, Quota(max_concurrency=2, tokens=rate))
    async with AsyncExitStack() as permits:
        await gate.enter_tenant(tenant, permits)
        tally = Tally()
        await gate.admit(call(tenant, reserved=800), permits, tally)
        tally.used_tokens = 50
    await leases.drain(timeout_s=60)
    assert len(store.given) == 1
    shared, tenant_back = store.given[0]
    assert shared.lease.keys == (keys.route_slots("chat"),)
    assert [(r.charge.key, r.amount) for r in shared.refunds] == [
        (keys.tenant_tokens("a"), 750),
        (keys.AGGREGATE_TOKENS, 750),
    ]
    assert tenant_back == GiveBack(tenant_back.lease)
    assert tenant_back.lease.keys == (keys.tenant_slots("a"),)
    assert await store.available(keys.AGGREGATE_TOKENS, rate) == pytest.approx(950)


async def test_a_body_already_in_takes_the_tenants_slot_in_the_one_decision_after_it():
    """Nothing is held while a whole body is read, so its tenant's slot is decided with
    the shared slots and the rates: one decision at the edge, not two, and the same
    refusal and release as when the slot comes first."""
    clock = FakeClock()
    store = YieldingStore(MemoryLimitStore(clock))
    route, aggregate = RoutePolicy(max_concurrency=5), Quota(max_concurrency=5)
    gate = Boundary(Leases(store, clock), dict.fromkeys(Endpoint, route), aggregate)
    tenant = Tenant("a", None, Quota(max_concurrency=1, requests=Rate(10, 60, 10)))
    async with AsyncExitStack() as permits:
        await gate.admit(call(tenant), permits, Tally(), tenant_slot=True)
        assert store.takes == 1
        assert await store.in_use(keys.tenant_slots("a")) == 1
        assert await store.in_use(keys.route_slots("chat")) == 1
        err = await refusal(gate.admit(call(tenant), AsyncExitStack(), Tally(), tenant_slot=True))
        assert (err.status, err.code) == (429, "tenant_concurrency_limited")
        assert await store.in_use(keys.route_slots("chat")) == 1
    assert await store.in_use(keys.tenant_slots("a")) == 0
    assert await store.in_use(keys.route_slots("chat")) == 0
