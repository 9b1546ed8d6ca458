"""Real `python -m sluicegate.sim` processes on loopback, stopped by fixture finalizers."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.support.processes import Proc, free_port

StartSim = Callable[..., Proc]


def launch(args: list[str], log_dir: Path, *, timeout_s: float = 20.0) -> Proc:
    """Start a simulator and wait until /sim/stats answers (it does even when `down`)."""
    port = free_port()
    log = log_dir / f"sim-{port}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluicegate.sim",
                *args,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    proc = Proc(popen, port, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"sim exited with {popen.returncode}:\n{proc.output()}")
        try:
            with urllib.request.urlopen(proc.url + "/sim/stats", timeout=1) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"sim did not become ready in {timeout_s}s:\n{proc.output()}")


@pytest.fixture(scope="session")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartSim]:
    """Starts simulators with the given flags; every one is stopped at session end."""
    procs: list[Proc] = []
    log_dir = tmp_path_factory.mktemp("sim-logs")

    def start(*args: str) -> Proc:
        proc = launch(list(args), log_dir)
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
