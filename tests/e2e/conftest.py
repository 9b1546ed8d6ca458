"""A real simulator and a real gateway on loopback, shared by the end-to-end tests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import aiohttp
import openai
import pytest
import yaml

from tests.support.processes import Proc, start

SIM_KEY = "sim-secret"
ALICE = "sk-test-alice"
BOB = "sk-test-bob"
MAX_BODY = 64 * 1024


def gateway_config(sim_url: str) -> dict:
    def deployment(name: str, **extra) -> dict:
        return {
            "name": name,
            "base_url": f"{sim_url}/v1",
            "model": "sim-model",
            "api_key_env": "SIM_KEY",
            "timeouts": {"connect_s": 1, "read_s": 1.5, "total_s": 30},
            **extra,
        }

    return {
        "server": {"max_body_bytes": MAX_BODY},
        "routes": {"chat": {"retry": {"max_attempts": 1}}},
        "models": [
            {"name": "chat", "deployments": [deployment("sim-chat")]},
            {"name": "embed", "deployments": [deployment("sim-embed")]},
            {"name": "private", "deployments": [deployment("sim-private")]},
            {
                "name": "miswired",
                "deployments": [deployment("sim-wrong-key", api_key_env="BAD_KEY")],
            },
        ],
        "tenants": [
            {"name": "alice", "keys": [{"env": "ALICE_KEY"}]},
            {
                "name": "bob",
                "keys": [{"sha256": hashlib.sha256(BOB.encode()).hexdigest()}],
                "models": ["chat", "embed"],
            },
        ],
    }


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    logs = tmp_path_factory.mktemp("sim")
    proc = start("sim", ["--model", "sim-model", "--api-key", SIM_KEY], logs)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def gateway(sim: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    folder = tmp_path_factory.mktemp("gateway")
    config = folder / "gateway.yaml"
    config.write_text(yaml.safe_dump(gateway_config(sim.url)))
    env = {"SIM_KEY": SIM_KEY, "BAD_KEY": "not-the-key", "ALICE_KEY": ALICE}
    proc = start("serve", ["--config", str(config)], folder, env=env, ready_path="/ready")
    yield proc
    proc.stop()


@pytest.fixture
async def http() -> aiohttp.ClientSession:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


@pytest.fixture
def alice(gateway: Proc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=ALICE, max_retries=0)


@pytest.fixture
def bob(gateway: Proc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=BOB, max_retries=0)


@pytest.fixture
async def faults(sim: Proc, http: aiohttp.ClientSession):
    """Set simulator faults for one test; they are cleared afterwards whatever happens."""

    async def apply(**settings) -> None:
        async with http.post(f"{sim.url}/sim/faults", json=settings) as resp:
            assert resp.status == 200, await resp.text()

    yield apply
    async with http.delete(f"{sim.url}/sim/faults") as resp:
        assert resp.status == 200


async def sim_stats(http: aiohttp.ClientSession, sim: Proc) -> dict:
    async with http.get(f"{sim.url}/sim/stats") as resp:
        return await resp.json()
