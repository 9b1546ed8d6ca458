"""Overload states from real signals, the ladder's refusal, and the admin status route."""

from __future__ import annotations

import asyncio

from tests.e2e.conftest import SIM_KEY, sim_stats
from tests.support.inprocess import inprocess_gateway

ENV = {"A_KEY": "sk-a", "ADMIN_KEY": "sk-admin", "SIM_KEY": SIM_KEY}


def config(sim_url: str) -> dict:
    return {
        "scheduling": {
            "lanes": [
                {"name": "interactive", "priority": 100, "ttft_slo_s": 0.02, "queue_size": 10},
                {"name": "background", "priority": 0, "queue_size": 10},
            ],
            "overload": {"interval_s": 0.05, "hold_s": 60},
        },
        "admin": {"keys": [{"env": "ADMIN_KEY"}]},
        "models": [
            {
                "name": "chat",
                "deployments": [
                    {
                        "name": "sim",
                        "base_url": f"{sim_url}/v1",
                        "model": "sim-model",
                        "api_key_env": "SIM_KEY",
                    }
                ],
            }
        ],
        "tenants": [{"name": "a", "keys": [{"env": "A_KEY"}]}],
    }


async def stream(http, url, lane="interactive"):
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
    }
    headers = {"Authorization": "Bearer sk-a", "X-Sluicegate-Lane": lane}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.read()


async def status(http, url, key="sk-admin"):
    async with http.get(f"{url}/admin/status", headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json()


async def test_slow_first_tokens_put_the_gateway_in_interactive_only(sim, http, faults):
    await faults(slowdown=5)
    async with inprocess_gateway(config(sim.url), ENV) as gw:
        code, before = await status(http, gw.url)
        assert (code, before["overload"]["state"]) == (200, "normal")
        assert (await stream(http, gw.url, "background"))[0] == 200
        for _ in range(6):
            assert (await stream(http, gw.url))[0] == 200
        for _ in range(100):
            state = (await status(http, gw.url))[1]["overload"]["state"]
            if state == "interactive_only":
                break
            await asyncio.sleep(0.05)
        assert state == "interactive_only"
        received = (await sim_stats(http, sim))["received"]
        code, body = await stream(http, gw.url, "background")
        assert code == 503
        assert b'"code":"overloaded"' in body
        assert (await stream(http, gw.url))[0] == 200
        async with http.get(f"{gw.url}/metrics") as resp:
            metrics = await resp.text()
    assert (await sim_stats(http, sim))["received"] == received + 1
    assert 'sluicegate_overload_state{state="interactive_only"} 1.0' in metrics


async def test_admin_status_needs_an_admin_key(sim, http):
    async with inprocess_gateway(config(sim.url), ENV) as gw:
        assert (await status(http, gw.url, key="sk-a"))[0] == 401
        code, body = await status(http, gw.url)
    assert code == 200
    assert set(body["models"]["chat"]["lanes"]) == {"interactive", "background"}
    assert body["gates"] == {"sim": "open"}
