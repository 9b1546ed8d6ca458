"""Library mode next to the proxy (MISSION 9.2): in-process callers and a real
`sluicegate serve` share one pool through the machine's Redis, under a key prefix of
the test's own; both call the shared simulator."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path

import aiohttp
import yaml

from sluicegate import GatewayError, Governor
from tests.e2e.conftest import SIM_KEY, sim_stats
from tests.e2e.test_fleet import fleet_config, key_of
from tests.support.processes import Proc, start
from tests.support.redis import REDIS_URL, redis_or_skip

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "hello there"}]
LIMIT = 4
ENV = {"SIM_KEY": SIM_KEY, "REDIS_URL": REDIS_URL, "FLEET_KEY_T": key_of("t")}


async def proxy_caller(http: aiohttp.ClientSession, proc: Proc, calls: int, codes: list) -> None:
    payload = {"model": "chat", "messages": MESSAGES, "max_tokens": 16}
    headers = {"Authorization": f"Bearer {key_of('t')}"}
    for _ in range(calls):
        async with http.post(f"{proc.url}/v1/chat/completions", json=payload, headers=headers) as r:
            body = await r.json()
            codes.append("ok" if r.status == 200 else body["error"]["code"])
        await pause(codes)


async def library_caller(
    governor: Governor, http: aiohttp.ClientSession, calls: int, codes: list
) -> None:
    """The caller's own client: a plain POST to the deployment the grant names."""
    for _ in range(calls):
        try:
            async with governor.attempt(
                model="chat", tenant="t", prompt_tokens=4, max_tokens=16
            ) as grant:
                url = f"{grant.base_url}/chat/completions"
                body = {"model": grant.upstream_model, "messages": MESSAGES, "max_tokens": 16}
                headers = {"Authorization": f"Bearer {grant.api_key}"}
                async with http.post(url, json=body, headers=headers) as resp:
                    assert resp.status == 200
                    usage = (await resp.json())["usage"]
                grant.report(usage["prompt_tokens"], usage["completion_tokens"])
            codes.append("ok")
        except GatewayError as refused:
            codes.append(refused.code)
        await pause(codes)


async def pause(codes: list) -> None:
    """Both kinds of caller think for a moment between calls, as real callers do: a
    closed loop with none would hand a slot its holder freed straight back to it (an
    in-process caller retakes it within microseconds, before any request over HTTP)."""
    await asyncio.sleep(random.uniform(0, 0.02))


async def test_library_callers_and_the_proxy_share_one_pool(sim, http, tmp_path):
    async with redis_or_skip() as (_, prefix):
        async with http.post(f"{sim.url}/sim/reset") as resp:
            assert resp.status == 200
        path = tmp_path / "shared.yaml"
        config = fleet_config(sim.url, "${REDIS_URL}", prefix, pool={"max_concurrency": LIMIT})
        path.write_text(yaml.safe_dump(config))
        proc = start("serve", ["--config", str(path)], tmp_path, env=ENV, ready_path="/ready")
        try:
            proxy: list[str] = []
            library: list[str] = []
            async with Governor.from_config(path, {**os.environ, **ENV}) as governor:
                await asyncio.gather(
                    *(proxy_caller(http, proc, 60, proxy) for _ in range(2 * LIMIT)),
                    *(library_caller(governor, http, 60, library) for _ in range(2 * LIMIT)),
                )
        finally:
            proc.stop()
    assert (await sim_stats(http, sim))["max_in_flight"] <= LIMIT
    for codes in (proxy, library):
        assert codes.count("ok") >= 3  # both kinds of caller are served
        assert codes.count("pool_concurrency_limited") >= 20
        assert set(codes) <= {"ok", "pool_concurrency_limited"}


async def test_the_example_says_in_one_line_what_it_misses():
    """Without a backend to call, the example stops with one line naming what to set, not
    a traceback, and never calls the gateway's own port in its place."""
    missing = ("BACKEND_URL", "BACKEND_KEY", "TEAM_A_KEY", "TEAM_B_KEY")
    env = {name: value for name, value in os.environ.items() if name not in missing}
    example = await asyncio.create_subprocess_exec(
        sys.executable,
        "examples/library_mode.py",
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(example.communicate(), 60)
    assert example.returncode != 0
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, err.decode()
    assert "BACKEND_URL" in lines[0]


async def test_the_example_runs_against_the_simulator(sim, tmp_path):
    async with redis_or_skip() as (_, prefix):
        env = {
            **os.environ,
            "BACKEND_URL": f"{sim.url}/v1",
            "BACKEND_KEY": SIM_KEY,
            "TEAM_A_KEY": "sk-example-a",
            "TEAM_B_KEY": "sk-example-b",
            "SLUICEGATE_KEY_PREFIX": prefix,
            "REDIS_URL": REDIS_URL,
        }
        example = await asyncio.create_subprocess_exec(
            sys.executable,
            "examples/library_mode.py",
            "--calls",
            "12",
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(example.communicate(), 60)
    assert example.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert len([line for line in lines if line.startswith("call ")]) == 12
    assert any(line.endswith(": ok via primary") for line in lines)
    assert lines[-1].startswith("summary: ok ")
