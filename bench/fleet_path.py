"""What the Redis store costs a request, and how fast shared state crosses replicas.

Starts, on loopback, a zero-latency simulator and gateways in front of it whose every
gate is on (route, tenant and aggregate concurrency; tenant and aggregate request and
token rates; a pool with concurrency and both rates, all far from their limits), one on
the memory store and two on Redis, and measures in one run:

- added latency: serial non-streaming requests alternating between the memory gateway
  and a Redis one, p50 and p99 of each and the difference, and each one's CPU per request;
- Redis round trips per request, by script, from `MONITOR` over a short run (the
  `take` calls are the ones between arrival and the first upstream byte);
- propagation: a provider 429 seen by replica A until replica B refuses
  `pool_cooling_down`, and failures on A until B refuses `circuit_open` (fleet breaker).

    .venv/bin/python bench/fleet_path.py [--requests N]

Needs Redis on 127.0.0.1:6379 (or SLUICEGATE_BENCH_REDIS_URL); keys under a prefix of
the run's own, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import secrets
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from importlib import resources
from pathlib import Path

import aiohttp
import orjson
import uvloop
from redis.asyncio import Redis

from sluicegate.bench.procs import Child, ProcessMeter, service

REDIS_URL = os.environ.get("SLUICEGATE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
LIMITS = {"max_concurrency": 10_000, "requests_per_minute": 1e9, "tokens_per_minute": 1e12}
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def config(store: str, prefix: str) -> str:
    """Model `chat` for latency and cooldowns; `flaky` for the circuit."""

    def deployment(name: str, pool: str) -> dict:
        breaker = {"consecutive_failures": 3, "min_attempts": 1000, "open_s": 30}
        return {
            "name": name,
            "base_url": "${SIM_URL}/v1",
            "model": "sim-model",
            "pools": [pool],
            "throttle_cooldown_s": 30,
            "breaker": breaker | ({"scope": "fleet"} if store == "redis" else {}),
        }

    document = {
        "store": store,
        "routes": {"chat": {"max_concurrency": 10_000, "retry": {"max_attempts": 1}}},
        "aggregate": LIMITS,
        "pools": [{"name": "p", **LIMITS}, {"name": "q", **LIMITS}],
        "models": [
            {"name": "chat", "deployments": [deployment("sim", "p")]},
            {"name": "flaky", "deployments": [deployment("sim-flaky", "q")]},
        ],
        "tenants": [{"name": "t", "keys": [{"env": "BENCH_KEY"}], "limits": LIMITS}],
    }
    if store == "redis":
        document["redis"] = {"url": REDIS_URL, "key_prefix": prefix}
    return orjson.dumps(document).decode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def call(
    http: aiohttp.ClientSession, gateway: Child, key: str, model: str = "chat"
) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{gateway.url}/v1/chat/completions"
    async with http.post(url, json={**BODY, "model": model}, headers=headers) as r:
        body = await r.json()
        return r.status, "ok" if r.status == 200 else body["error"]["code"]


async def latency(
    http: aiohttp.ClientSession, memory: Child, redis: Child, key: str, requests: int
) -> None:
    times: dict[str, list[float]] = {"memory": [], "redis": []}
    meters = {"memory": ProcessMeter(memory.popen.pid), "redis": ProcessMeter(redis.popen.pid)}
    for _ in range(200):
        await call(http, memory, key)
        await call(http, redis, key)
    cpu = {name: meter.cpu_s() for name, meter in meters.items()}
    for _ in range(requests):
        for name, gateway in (("memory", memory), ("redis", redis)):
            began = time.perf_counter()
            status, _ = await call(http, gateway, key)
            times[name].append(time.perf_counter() - began)
            assert status == 200
    for name, values in times.items():
        used = (meters[name].cpu_s() - cpu[name]) / requests
        print(
            f"{name:6}: p50 {percentile(values, 0.5) * 1e3:.3f} ms, "
            f"p99 {percentile(values, 0.99) * 1e3:.3f} ms, gateway CPU {used * 1e3:.3f} ms/request"
        )
    for q in (0.5, 0.99):
        added = percentile(times["redis"], q) - percentile(times["memory"], q)
        print(f"added by the Redis path at p{int(q * 100)}: {added * 1e3:.3f} ms")


def script_names() -> dict[str, str]:
    folder = resources.files("sluicegate.stores") / "lua"
    prelude = (folder / "now.lua").read_text()
    names = {}
    for script in folder.iterdir():
        if script.name.endswith(".lua") and script.name != "now.lua":
            text = prelude + "\n" + script.read_text()
            names[hashlib.sha1(text.encode()).hexdigest()] = script.name[:-4]
    return names


async def round_trips(
    http: aiohttp.ClientSession, redis: Child, key: str, requests: int, prefix: str
) -> None:
    """Scripts run on this run's keys only: the Redis may be shared."""
    client = Redis.from_url(REDIS_URL)
    names = script_names()
    seen: Counter[str] = Counter()
    async with client.monitor() as monitor:

        async def listen() -> None:
            async for command in monitor.listen():
                words = command["command"].split()
                if words and words[0] == "EVALSHA" and prefix in command["command"]:
                    seen[names.get(words[1].strip("'\""), "?")] += 1

        listening = asyncio.ensure_future(listen())
        await asyncio.sleep(0.5)
        for _ in range(requests):
            await call(http, redis, key)
        await asyncio.sleep(0.5)
        listening.cancel()
    await client.aclose()
    per_request = ", ".join(f"{name} {count / requests:.2f}" for name, count in seen.most_common())
    print(
        f"Redis scripts per request ({requests} requests, background loops included): {per_request}"
    )


async def until(
    http: aiohttp.ClientSession, gateway: Child, key: str, model: str, wanted: str
) -> float:
    """Seconds until `gateway` answers `wanted`, asking as fast as it answers."""
    began = time.perf_counter()
    while time.perf_counter() - began < 5.0:
        if (await call(http, gateway, key, model))[1] == wanted:
            return time.perf_counter() - began
    raise RuntimeError(f"{gateway.url} did not answer {wanted} within 5 s")


async def propagation(
    http: aiohttp.ClientSession, sim: Child, one: Child, two: Child, key: str
) -> None:
    """From the answer on A that changed the shared state to B's first refusal for it."""
    for fault, model, seen, wanted, tries in (
        ({"throttle_rate": 1.0}, "chat", "upstream_throttled", "pool_cooling_down", 1),
        ({"error_rate": 1.0}, "flaky", "upstream_error", "circuit_open", 3),
    ):
        async with http.post(f"{sim.url}/sim/faults", json=fault) as r:
            assert r.status == 200
        for _ in range(tries):
            assert (await call(http, one, key, model))[1] == seen
        waited = await until(http, two, key, model, wanted)
        print(f"{wanted}: B refused {waited * 1e3:.1f} ms after A's last {seen}")
        async with http.delete(f"{sim.url}/sim/faults") as r:
            assert r.status == 200


async def main(requests: int) -> None:
    prefix = f"sluicegate-bench:{secrets.token_hex(4)}:"
    key = f"sk-bench-{secrets.token_hex(8)}"
    env = {"BENCH_KEY": key}
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        logs = Path(folder)
        sim = stack.enter_context(service("sim", ["sim", "--time-scale", "0"], "/health", logs))
        env["SIM_URL"] = sim.url
        gateways = {}
        for name, store in (("memory", "memory"), ("redis-a", "redis"), ("redis-b", "redis")):
            path = logs / f"{name}.yaml"
            path.write_text(config(store, prefix))
            args = ["serve", "--config", str(path)]
            gateways[name] = stack.enter_context(service(name, args, "/ready", logs, env))
        async with aiohttp.ClientSession() as http:
            await latency(http, gateways["memory"], gateways["redis-a"], key, requests)
            await round_trips(http, gateways["redis-a"], key, 200, prefix)
            await propagation(http, sim, gateways["redis-a"], gateways["redis-b"], key)
    client = Redis.from_url(REDIS_URL)
    stale = [k async for k in client.scan_iter(match=f"{prefix}*")]
    if stale:
        await client.delete(*stale)
    await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    uvloop.run(main(parser.parse_args().requests))
