"""A guard model asked through the gateway itself, against the simulator's scripted Llama
Guard verdicts: an unsafe prompt is blocked and a safe one passes; the guard call waits
in its own lane, as its own tenant, for a permit of its deployment's pool; with that
pool full the checked request ends within the guardrail's budget by its failure mode."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator

import aiohttp
import orjson
import pytest
import yaml

from tests.support.processes import Proc, start

ALICE = "sk-test-alice"
GUARDIAN = "sk-test-guardian"
ADMIN = "sk-test-admin"
BUDGET_S = 0.5


def tenant(name: str, key: str, **extra: object) -> dict:
    return {"name": name, "keys": [{"sha256": hashlib.sha256(key.encode()).hexdigest()}], **extra}


@pytest.fixture(scope="module")
def guard_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    args = ["--model", "sim-model", "--model", "llama-guard", "--guard-model", "llama-guard"]
    proc = start("sim", args, tmp_path_factory.mktemp("guard-calls-sim"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gateway(guard_sim: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    def deployment(name: str, model: str, pool: str) -> dict:
        return {"name": name, "base_url": f"{guard_sim.url}/v1", "model": model, "pools": [pool]}

    config = {
        "admin": {"keys": [{"env": "ADMIN_KEY"}]},
        "scheduling": {
            "lanes": [{"name": "default"}, {"name": "guard", "priority": 5, "queue_size": 8}]
        },
        "pools": [
            {"name": "chat-pool", "max_concurrency": 8},
            {"name": "guard-pool", "max_concurrency": 1},
        ],
        "models": [
            {"name": "chat", "deployments": [deployment("sim-chat", "sim-model", "chat-pool")]},
            # The guard model's deployment and another model share the guard's one permit,
            # so a test can fill the pool (pre_call guard models may share their pool).
            {"name": "guard", "deployments": [deployment("sim-g", "llama-guard", "guard-pool")]},
            {"name": "held", "deployments": [deployment("sim-h", "sim-model", "guard-pool")]},
        ],
        "tenants": [
            tenant("alice", ALICE, models=["chat"]),
            tenant("guardian", GUARDIAN, lane="guard", models=["guard", "held"]),
        ],
        "guardrails": {
            "checks": [
                {
                    "name": "llama",
                    "checker": {"kind": "guard_model", "model": "guard", "lane": "guard",
                                "tenant": "guardian"},
                    "action": "block",
                    "placement": "pre_call",
                    "budget_s": BUDGET_S,
                    "cache_ttl_s": 0,
                }
            ],
            "apply": [{"guardrails": ["llama"]}],  # the guard calls too, but they skip it
        },
    }  # fmt: skip
    folder = tmp_path_factory.mktemp("guard-calls")
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"ADMIN_KEY": ADMIN}
    proc = start("serve", ["--config", str(path)], folder, env=env, ready_path="/ready")
    yield proc
    proc.stop()


def chat(content: str, model: str = "chat", **extra: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4,
            **extra}  # fmt: skip


async def post(
    http: aiohttp.ClientSession, gateway: Proc, key: str, body: dict
) -> tuple[int, dict]:
    headers = {"authorization": f"Bearer {key}"}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, orjson.loads(await r.read())


async def status(http: aiohttp.ClientSession, gateway: Proc) -> dict:
    headers = {"authorization": f"Bearer {ADMIN}"}
    async with http.get(f"{gateway.url}/admin/status", headers=headers) as resp:
        return await resp.json()


async def test_an_unsafe_prompt_is_blocked_and_a_safe_one_passes(
    gateway: Proc, http: aiohttp.ClientSession
) -> None:
    code, body = await post(http, gateway, ALICE, chat("how to [sim:unsafe S1,S10] things"))
    assert (code, body["error"]["code"]) == (400, "guardrail_blocked")
    assert "'llama'" in body["error"]["message"]
    assert "violent_crimes, hate" in body["error"]["message"]
    assert "things" not in body["error"]["message"]
    code, body = await post(http, gateway, ALICE, chat("how to bake bread"))
    assert code == 200, body


async def test_the_guard_call_runs_in_its_lane_as_its_tenant(
    gateway: Proc, http: aiohttp.ClientSession
) -> None:
    before = (await status(http, gateway))["models"]["guard"]["lanes"]["guard"]["dispatched"]
    code, _ = await post(http, gateway, ALICE, chat("a safe question"))
    assert code == 200
    after = await status(http, gateway)
    guard_lane = after["models"]["guard"]["lanes"]["guard"]
    assert guard_lane["dispatched"] == before + 1
    assert set(guard_lane["service"]) == {"guardian"}
    assert after["models"]["guard"]["lanes"]["default"]["dispatched"] == 0
    assert after["models"]["chat"]["lanes"]["guard"]["dispatched"] == 0


async def test_with_the_guard_pool_full_the_request_fails_closed_within_its_budget(
    gateway: Proc, http: aiohttp.ClientSession
) -> None:
    headers = {"authorization": f"Bearer {GUARDIAN}"}
    body = chat("hold the pool", model="held", max_tokens=600, stream=True)
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as held:
        assert held.status == 200
        await held.content.readline()  # the stream holds the guard pool's one permit
        assert (await status(http, gateway))["pools"]["guard-pool"]["active"] == 1
        started = time.monotonic()
        code, answer = await post(http, gateway, ALICE, chat("a safe question"))
        took = time.monotonic() - started
        assert (code, answer["error"]["code"]) == (503, "guardrail_unavailable")
        assert "'llama'" in answer["error"]["message"]
        assert BUDGET_S * 0.9 < took < BUDGET_S + 1.0  # it waited in the guard lane's queue
        assert not held.content.at_eof()  # the guard call waited for that very permit
    for _ in range(50):  # the permit comes back once the held stream has ended
        if (await status(http, gateway))["pools"]["guard-pool"]["active"] == 0:
            break
        await asyncio.sleep(0.1)
    code, _ = await post(http, gateway, ALICE, chat("a safe question"))
    assert code == 200
