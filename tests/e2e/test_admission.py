"""Admission and capacity pools through a real gateway and simulator (MISSION 1, 2, 3.1-3.2)."""

from __future__ import annotations

import asyncio
import random
from contextlib import suppress

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Endpoint
from sluicegate.pipeline import Inbound
from tests.e2e.conftest import SIM_KEY, sim_stats
from tests.support.inprocess import InProcessGateway, inprocess_gateway

KEYS = {"A_KEY": "sk-a", "B_KEY": "sk-b", "C_KEY": "sk-c"}
ENV = {"SIM_KEY": SIM_KEY, **KEYS}
MESSAGES = [{"role": "user", "content": "hello there"}]


def config(sim_url: str, *, tenants: dict | None = None, **top) -> dict:
    limits = tenants or {}
    return {
        "routes": {"chat": {"max_output_tokens": 256}},
        "pools": [{"name": "shared", "max_concurrency": 4}],
        "models": [
            {
                "name": "chat",
                "deployments": [
                    {
                        "name": "sim",
                        "base_url": f"{sim_url}/v1",
                        "model": "sim-model",
                        "api_key_env": "SIM_KEY",
                        "pools": ["shared"],
                    }
                ],
            }
        ],
        "tenants": [
            {"name": name, "keys": [{"env": f"{name.upper()}_KEY"}], "limits": limits.get(name, {})}
            for name in ("a", "b", "c")
        ],
        **top,
    }


def headers(tenant: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-{tenant}", **extra}


async def post(http, gw: InProcessGateway, tenant: str, body: dict | None = None, **extra):
    body = body or {"model": "chat", "messages": MESSAGES, "max_tokens": 2}
    url = f"{gw.url}/v1/chat/completions"
    async with http.post(url, json=body, headers=headers(tenant, **extra)) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def in_process(gw: InProcessGateway, max_tokens: int, timeout_s: float | None = None) -> None:
    """An in-process caller of the pool API, as job workers and hedges will be."""
    tenant = gw.settings.tenants[0]

    async def payload() -> dict:
        return {"model": "chat", "messages": MESSAGES, "max_tokens": max_tokens}

    inbound = Inbound(Endpoint.CHAT, tenant, gw.runtime.clock.now(), payload, timeout_s)
    async with gw.runtime.pipeline.run(inbound) as answer:
        await answer.read()


@pytest.fixture
async def reset(sim, http):
    async with http.post(f"{sim.url}/sim/reset") as resp:
        assert resp.status == 200


async def test_pool_limit_holds_for_http_and_in_process_callers_together(sim, http, reset):
    async with inprocess_gateway(config(sim.url), ENV) as gw:
        body = {"model": "chat", "messages": MESSAGES, "max_tokens": 30}
        outcomes = await asyncio.gather(
            *(post(http, gw, "abc"[i % 3], body) for i in range(40)),
            *(in_process(gw, 30) for _ in range(40)),
            return_exceptions=True,
        )
        http_refusals = [o for o in outcomes[:40] if o[0] != 200]
        local_refusals = [o for o in outcomes[40:] if isinstance(o, GatewayError)]
        assert all(o is None or isinstance(o, GatewayError) for o in outcomes[40:])
        assert gw.runtime.pools["shared"].counters.active == 0
    stats = await sim_stats(http, sim)
    assert stats["max_in_flight"] == 4
    assert stats["started"] == 80 - len(http_refusals) - len(local_refusals)
    assert http_refusals
    for status, head, body in http_refusals:
        assert (status, body["error"]["code"]) == (503, "pool_concurrency_limited")
        assert "retry-after" not in {k.lower() for k in head}


async def test_a_thousand_failing_timing_out_or_cancelled_attempts_leave_no_permit(
    sim, http, reset, faults
):
    await faults(error_rate=0.25)
    raw = config(sim.url)
    raw["scheduling"] = {"lanes": [{"name": "default", "queue_size": 1000, "max_queue_age_s": 5}]}
    raw["models"][0]["deployments"][0]["cancel_grace_s"] = 0.05
    raw["models"][0]["deployments"][0]["breaker"] = {
        "consecutive_failures": 10_000,
        "failure_ratio": 1.0,
    }
    raw["routes"]["chat"]["retry"] = {"max_attempts": 1}
    rng = random.Random(7)
    peak = 0

    async def cancelled_stream(gw):
        body = {"model": "chat", "messages": MESSAGES, "max_tokens": 40, "stream": True}
        async with (
            aiohttp.ClientSession() as own,
            own.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers("a")) as resp,
        ):
            if resp.status == 200:
                await resp.content.readany()

    async def timed_out(gw):
        body = {"model": "chat", "messages": MESSAGES, "max_tokens": 60}
        return await post(http, gw, "b", body, **{"X-Sluicegate-Timeout": "0.08"})

    async def local_failure(gw):
        with suppress(GatewayError):
            await in_process(gw, 3)

    async with inprocess_gateway(raw, ENV) as gw:
        pool = gw.runtime.pools["shared"]
        kinds = (cancelled_stream, timed_out, local_failure)
        gate = asyncio.Semaphore(16)

        async def one():
            nonlocal peak
            async with gate:
                task = asyncio.ensure_future(rng.choice(kinds)(gw))
                while not task.done():
                    peak = max(peak, pool.counters.active)
                    await asyncio.wait({task}, timeout=0.002)
                task.result()

        await asyncio.gather(*(one() for _ in range(1000)))
        await asyncio.sleep(0.2)
        assert pool.counters.active == 0
        stats = await sim_stats(http, sim)
    assert peak <= 4
    assert stats["max_in_flight"] <= 4
    assert stats["running"] == stats["waiting"] == 0
    assert stats["failed"] > 0
    assert stats["cancelled"] > 0


async def test_tenant_over_its_quota_gets_429_while_another_is_unaffected(sim, http, reset):
    tenants = {"a": {"requests_per_minute": 3}}
    async with inprocess_gateway(config(sim.url, tenants=tenants), ENV) as gw:
        for _ in range(3):
            assert (await post(http, gw, "a"))[0] == 200
        before = (await sim_stats(http, sim))["received"]
        status, head, body = await post(http, gw, "a")
        assert (status, body["error"]["code"]) == (429, "tenant_rate_limited")
        assert head["Retry-After"] == "20"
        assert 19_000 <= int(head["retry-after-ms"]) <= 20_000
        assert (await sim_stats(http, sim))["received"] == before
        for _ in range(5):
            assert (await post(http, gw, "b"))[0] == 200


async def test_tenant_concurrency_refusal_has_no_retry_after(sim, http, reset):
    tenants = {"a": {"max_concurrency": 1}}
    async with inprocess_gateway(config(sim.url, tenants=tenants), ENV) as gw:
        slow = {"model": "chat", "messages": MESSAGES, "max_tokens": 40}
        results = await asyncio.gather(*(post(http, gw, "a", slow) for _ in range(3)))
    refused = [r for r in results if r[0] != 200]
    assert len(refused) == 2
    for status, head, body in refused:
        assert (status, body["error"]["code"]) == (429, "tenant_concurrency_limited")
        assert "retry-after" not in {k.lower() for k in head}
    assert (await sim_stats(http, sim))["received"] == 1


async def test_aggregate_limit_gives_503_while_every_tenant_is_within_its_own(sim, http, reset):
    tenants = {t: {"requests_per_minute": 10} for t in "abc"}
    raw = config(sim.url, tenants=tenants, aggregate={"requests_per_minute": 4})
    async with inprocess_gateway(raw, ENV) as gw:
        statuses = [(await post(http, gw, t))[0] for t in "abca"]
        assert statuses == [200, 200, 200, 200]
        status, head, body = await post(http, gw, "b")
    assert (status, body["error"]["code"]) == (503, "capacity_exhausted")
    assert head["Retry-After"] == "15"
    assert (await sim_stats(http, sim))["received"] == 4


async def test_large_prompts_are_limited_by_tokens_not_by_request_count(sim, http, reset):
    tenants = {"a": {"requests_per_minute": 100, "tokens_per_minute": 3000}}
    async with inprocess_gateway(config(sim.url, tenants=tenants), ENV) as gw:
        big = {
            "model": "chat",
            "messages": [{"role": "user", "content": "x" * 4000}],
            "max_tokens": 10,
        }
        assert (await post(http, gw, "a", big))[0] == 200
        assert (await post(http, gw, "a", big))[0] == 200
        status, head, body = await post(http, gw, "a", big)
        assert (status, body["error"]["code"]) == (429, "tenant_token_limited")
        assert int(head["Retry-After"]) > 0
        small = {"model": "chat", "messages": MESSAGES, "max_tokens": 10}
        assert (await post(http, gw, "a", small))[0] == 200


async def test_streamed_usage_settles_the_reservation_and_stays_hidden_unless_asked(
    sim, http, reset
):
    tenants = {"a": {"tokens_per_minute": 100_000}}
    async with inprocess_gateway(config(sim.url, tenants=tenants), ENV) as gw:
        pool = gw.runtime.pools["shared"]
        url = f"{gw.url}/v1/chat/completions"
        base = {
            "model": "chat",
            "messages": [{"role": "user", "content": "y" * 40}],
            "stream": True,
        }
        async with http.post(url, json={**base, "max_tokens": 5}, headers=headers("a")) as resp:
            hidden = await resp.text()
        asked = {**base, "max_tokens": 5, "stream_options": {"include_usage": True}}
        async with http.post(url, json=asked, headers=headers("a")) as resp:
            shown = await resp.text()
        assert '"usage":{' not in hidden
        assert hidden.rstrip().endswith("data: [DONE]")
        assert '"usage":{' in shown
        # The estimate counts every string and key of the message: "role", "user",
        # "content" and the 40 characters of text.
        assert pool.counters.tokens_reserved == 2 * (1 + 1 + 2 + 10 + 5)
        assert pool.counters.tokens_used == 2 * (10 + 5)
        no_cap = {
            "model": "chat",
            "messages": [{"role": "user", "content": "y" * 40}],
            "max_tokens": 3,
        }
        assert (await post(http, gw, "a", no_cap))[0] == 200
        assert pool.counters.tokens_used == 2 * 15 + 13


async def test_prompt_over_budget_is_400_and_never_sent(sim, http, reset):
    tenants = {"a": {"max_prompt_tokens": 100}}
    async with inprocess_gateway(config(sim.url, tenants=tenants), ENV) as gw:
        big = {"model": "chat", "messages": [{"role": "user", "content": "z" * 800}]}
        status, head, body = await post(http, gw, "a", big)
    assert (status, body["error"]["code"]) == (400, "prompt_too_long")
    assert "at most 100" in body["error"]["message"]
    assert head["x-should-retry"] == "false"
    assert (await sim_stats(http, sim))["received"] == 0


async def test_more_messages_than_the_route_allows_is_400_and_never_sent(sim, http, reset):
    raw = config(sim.url)
    raw["routes"]["chat"]["max_messages"] = 3
    async with inprocess_gateway(raw, ENV) as gw:
        many = {"model": "chat", "messages": MESSAGES * 4, "max_tokens": 2}
        status, _, body = await post(http, gw, "a", many)
        assert (await post(http, gw, "a", {**many, "messages": MESSAGES * 3}))[0] == 200
    assert (status, body["error"]["param"]) == (400, "messages")
    assert "at most 3" in body["error"]["message"]
    assert (await sim_stats(http, sim))["received"] == 1


async def test_a_wait_counts_against_the_deadline_and_ends_in_504(sim, http, reset):
    raw = config(sim.url)
    raw["scheduling"] = {"lanes": [{"name": "default", "queue_size": 10, "max_queue_age_s": 30}]}
    raw["pools"][0]["max_concurrency"] = 1
    async with inprocess_gateway(raw, ENV) as gw:
        slow = {"model": "chat", "messages": MESSAGES, "max_tokens": 80}
        holder = asyncio.ensure_future(post(http, gw, "a", slow))
        await asyncio.sleep(0.1)
        started = asyncio.get_running_loop().time()
        status, head, body = await post(http, gw, "b", None, **{"X-Sluicegate-Timeout": "0.3"})
        waited = asyncio.get_running_loop().time() - started
        assert (await holder)[0] == 200
    assert (status, body["error"]["code"]) == (504, "deadline_exceeded")
    assert head["x-should-retry"] == "false"
    assert waited < 5
    assert (await sim_stats(http, sim))["received"] == 1


async def test_a_callers_deadline_is_held_to_the_routes_longest(sim, http, reset):
    """`X-Sluicegate-Timeout: 1e308` asks to wait for ever; the route allows 0.3 s."""
    raw = config(sim.url)
    raw["routes"]["chat"]["default_timeout_s"] = 0.3
    raw["scheduling"] = {"lanes": [{"name": "default", "queue_size": 10, "max_queue_age_s": 30}]}
    raw["pools"][0]["max_concurrency"] = 1
    async with inprocess_gateway(raw, ENV) as gw:
        holder = asyncio.ensure_future(in_process(gw, 80, timeout_s=30))
        await asyncio.sleep(0.1)
        started = asyncio.get_running_loop().time()
        status, _, body = await post(http, gw, "b", None, **{"X-Sluicegate-Timeout": "1e308"})
        waited = asyncio.get_running_loop().time() - started
        await holder
    assert (status, body["error"]["code"]) == (504, "deadline_exceeded")
    assert waited < 5


async def test_sdk_read_timeout_header_sets_the_deadline(sim, http, reset):
    async with inprocess_gateway(config(sim.url), ENV) as gw:
        status, _, body = await post(http, gw, "a", None, **{"x-stainless-read-timeout": "0.01"})
        assert (status, body["error"]["code"]) == (504, "deadline_exceeded")
        status, _, body = await post(http, gw, "a", None, **{"X-Sluicegate-Timeout": "soon"})
        assert status == 400


async def test_a_cooling_pool_refuses_with_the_cooldowns_end(sim, http, reset):
    async with inprocess_gateway(config(sim.url), ENV) as gw:
        await gw.runtime.pools["shared"].cool(5)
        status, head, body = await post(http, gw, "a")
    assert (status, body["error"]["code"]) == (503, "pool_cooling_down")
    assert head["Retry-After"] == "5"
    assert (await sim_stats(http, sim))["received"] == 0


async def test_route_concurrency_refuses_before_the_body_is_read(sim, http, reset):
    raw = config(sim.url)
    raw["routes"]["chat"]["max_concurrency"] = 1
    async with inprocess_gateway(raw, ENV) as gw:
        slow = {"model": "chat", "messages": MESSAGES, "max_tokens": 40}
        holder = asyncio.ensure_future(post(http, gw, "a", slow))
        await asyncio.sleep(0.1)
        status, head, body = await post(http, gw, "b")
        assert (await holder)[0] == 200
        async with http.get(f"{gw.url}/metrics") as resp:
            text = await resp.text()
    assert (status, body["error"]["code"]) == (503, "capacity_exhausted")
    assert "retry-after" not in {k.lower() for k in head}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    refusal = (("reason", "capacity_exhausted"), ("route", "chat"), ("status", "503"))
    assert samples[("sluicegate_refusals_total", refusal)] == 1
    upstream = [
        value
        for (name, labels), value in samples.items()
        if name == "sluicegate_stage_seconds_count"
        and {("model", "chat"), ("route", "chat"), ("stage", "upstream")} <= set(labels)
    ]
    assert sum(upstream) == 1
    assert samples[("sluicegate_pool_active_attempts", (("pool", "shared"),))] == 0
    assert samples[("sluicegate_pool_concurrency_limit", (("pool", "shared"),))] == 4
