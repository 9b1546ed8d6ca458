"""Real `sluicegate sim` processes on loopback, stopped by fixture finalizers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import openai
import pytest

from tests.support.processes import Proc
from tests.support.processes import start as launch

StartSim = Callable[..., Proc]


@pytest.fixture(scope="session")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    """Starts simulators with the given flags; every one is stopped at session end."""
    procs: list[Proc] = []
    log_dir = tmp_path_factory.mktemp("sim-logs")

    def start(*args: str) -> Proc:
        # /sim/stats answers even while the `down` fault makes /health fail.
        proc = launch("sim", list(args), log_dir, ready_path="/sim/stats")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()
    for proc in procs:
        assert proc.popen.returncode == 0, proc.output()
        assert "Traceback" not in proc.output()


@pytest.fixture(scope="session")
def shared_sim(start_sim: StartSim) -> Proc:
    """The default simulator, sped up tenfold, serving two model names."""
    return start_sim(
        "--time-scale", "0.1", "--model", "sim-model", "--model", "other-model",
        "--default-max-tokens", "8", "--max-model-len", "16384",
    )  # fmt: skip


@pytest.fixture
async def sim(shared_sim: Proc, http: aiohttp.ClientSession) -> Proc:
    """The shared simulator with its faults cleared and its counters zeroed."""
    async with http.delete(shared_sim.url + "/sim/faults") as resp:
        assert resp.status == 200
    async with http.post(shared_sim.url + "/sim/reset") as resp:
        assert resp.status == 200
    return shared_sim


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def client(shared_sim: Proc) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=shared_sim.url + "/v1", api_key="x", max_retries=0
    ) as sdk:
        yield sdk
