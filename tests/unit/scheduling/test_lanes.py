from __future__ import annotations

import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Lane, RoutePolicy, Scheduling, Tenant
from sluicegate.scheduling.lanes import Demand, classify, cost

LANES = (
    Lane("interactive", priority=100, max_prompt_tokens=1000, max_cost=3000, demote_to="heavy"),
    Lane("heavy", priority=50, max_cost=50_000),
    Lane("background", priority=0),
)
SCHEDULING = Scheduling(LANES, "interactive", cost_alpha=1, cost_beta=2, cost_gamma=500)
SMALL = Demand(100, 100, False)
ANYONE = Tenant("t", None)
ANY_ROUTE = RoutePolicy()


def lane_of(asked=None, tenant=ANYONE, route=ANY_ROUTE, demand=SMALL) -> str:
    return classify(SCHEDULING, asked, tenant, route, demand).name


def test_the_cost_proxy():
    assert cost(SCHEDULING, Demand(100, 10, True)) == 100 + 20 + 500


def test_lane_comes_from_the_header_else_tenant_else_route_else_default():
    assert lane_of() == "interactive"
    assert lane_of(route=RoutePolicy(lane="heavy")) == "heavy"
    assert lane_of(
        tenant=Tenant("t", None, lane="background"), route=RoutePolicy(lane="heavy")
    ) == ("background")
    assert lane_of(asked="heavy", tenant=Tenant("t", None, lane="interactive")) == "heavy"


def test_long_prompts_and_costly_requests_are_demoted():
    assert lane_of(demand=Demand(1001, 10, False)) == "heavy"
    assert lane_of(demand=Demand(500, 1500, False)) == "heavy"
    assert lane_of(demand=Demand(100, 1250, False)) == "interactive"
    assert lane_of(demand=Demand(100, 1250, True)) == "heavy"


def test_a_request_too_costly_for_a_lane_without_demotion_is_refused():
    with pytest.raises(GatewayError) as info:
        lane_of(asked="heavy", demand=Demand(40_000, 10_000, False))
    assert (info.value.status, info.value.code) == (400, "request_too_costly")
    assert info.value.should_retry is False


def test_unknown_lane_is_a_400():
    with pytest.raises(GatewayError) as info:
        lane_of(asked="vip")
    assert (info.value.status, info.value.code) == (400, "unknown_lane")


def test_the_header_moves_a_request_down_never_up_past_its_own_lane():
    heavy = Tenant("t", None, lane="heavy")
    assert lane_of(asked="background", tenant=heavy) == "background"
    assert lane_of(asked="heavy", tenant=heavy) == "heavy"
    with pytest.raises(GatewayError) as info:
        lane_of(asked="interactive", tenant=heavy)
    assert (info.value.status, info.value.code) == (403, "lane_not_allowed")
    assert "heavy or a lower-priority lane" in info.value.message
    with pytest.raises(GatewayError):
        lane_of(asked="heavy", route=RoutePolicy(lane="background"))


def test_a_tenant_listing_lanes_may_ask_for_exactly_those():
    vip = Tenant("t", None, lane="background", lanes=frozenset({"interactive"}))
    assert lane_of(asked="interactive", tenant=vip) == "interactive"
    assert lane_of(asked="background", tenant=vip) == "background"
    with pytest.raises(GatewayError) as info:
        lane_of(asked="heavy", tenant=vip)
    assert "background, interactive" in info.value.message
