"""A fleet: several real `sluicegate serve` replicas sharing one Redis (MISSION 9.1, 11.2).

The machine's Redis holds the shared state under a key prefix of each test's own; the
tests that take Redis away start their own `redis-server`. The upstream is one real
simulator; clients spread their requests over the replicas round robin.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import SIM_KEY, sim_stats
from tests.support.processes import Proc, start
from tests.support.redis import REDIS_URL, redis_or_skip, redis_server

KEY = "sk-fleet"
MESSAGES = [{"role": "user", "content": "hello there"}]


def fleet_config(
    sim_url: str,
    redis_url: str,
    prefix: str,
    *,
    pool: dict,
    tenant: dict | None = None,
    tenants: tuple[str, ...] = ("t",),
    scheduling: dict | None = None,
    breaker: dict | None = None,
    lanes: list | None = None,
    deployment: dict | None = None,
    **redis,
) -> dict:
    """Leases of 1 s, so that lapses show within a test. Calls to Redis may take up to 1 s
    before they count as unanswered: on this 2-core machine, shared by the replicas, the
    simulator, Redis and the callers, a replica's loop lags past the 50 ms default under a
    flood, which would make it leave the shared store for its local share (the
    degraded-mode tests take Redis away for real instead)."""
    return {
        "store": "redis",
        "redis": {
            "url": "${REDIS_URL}",
            "key_prefix": prefix,
            "lease_ttl_s": 1,
            "timeout_s": 1.0,
            **redis,
        },
        "routes": {"chat": {"retry": {"max_attempts": 1}}},
        "scheduling": {"lanes": lanes or [{"name": "interactive"}], **(scheduling or {})},
        "pools": [{"name": "shared", **pool}],
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
                        "cancel_grace_s": 0,
                        "breaker": breaker or {"consecutive_failures": 1000, "min_attempts": 1000},
                        **(deployment or {}),
                    }
                ],
            }
        ],
        "tenants": [
            {"name": name, "keys": [{"env": f"FLEET_KEY_{name.upper()}"}], "limits": tenant or {}}
            for name in tenants
        ],
    }


class Fleet:
    def __init__(self, folder: Path, sim: Proc, redis_url: str, prefix: str) -> None:
        self.folder, self.sim, self.redis_url, self.prefix = folder, sim, redis_url, prefix
        self.replicas: list[Proc] = []

    def start(self, count: int, **config) -> list[Proc]:
        path = self.folder / f"fleet-{len(self.replicas)}.yaml"
        path.write_text(
            yaml.safe_dump(fleet_config(self.sim.url, self.redis_url, self.prefix, **config))
        )
        env = {"SIM_KEY": SIM_KEY, "REDIS_URL": self.redis_url}
        env |= {f"FLEET_KEY_{name.upper()}": key_of(name) for name in config.get("tenants", "t")}
        started = [
            start("serve", ["--config", str(path)], self.folder, env=env, ready_path="/ready")
            for _ in range(count)
        ]
        self.replicas += started
        return started

    def stop(self) -> None:
        for proc in self.replicas:
            if proc.popen.poll() is None:
                proc.stop()


@pytest.fixture
async def fleet(sim: Proc, http: aiohttp.ClientSession, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with redis_or_skip() as (_, prefix):
        async with http.post(f"{sim.url}/sim/reset") as resp:
            assert resp.status == 200
        group = Fleet(tmp_path, sim, REDIS_URL, prefix)
        try:
            yield group
        finally:
            group.stop()
            async with http.delete(f"{sim.url}/sim/faults") as resp:
                assert resp.status == 200


def key_of(tenant: str) -> str:
    return KEY if tenant == "t" else f"{KEY}-{tenant}"


async def chat(
    http: aiohttp.ClientSession, proc: Proc, max_tokens: int = 4, tenant: str = "t", **body
) -> tuple:
    payload = {"model": "chat", "messages": MESSAGES, "max_tokens": max_tokens, **body}
    url = f"{proc.url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key_of(tenant)}"}
    async with http.post(url, json=payload, headers=headers) as resp:
        body = await resp.json()
        return resp.status, resp.headers, body


def code(answer: tuple) -> str:
    status, _, body = answer
    return "ok" if status == 200 else body["error"]["code"]


async def flood(http, replicas: list[Proc], total: int, width: int, **body) -> list[tuple]:
    """`total` requests from `width` callers at once, round robin over the replicas."""
    targets = itertools.cycle(replicas)
    answers: list[tuple] = []

    async def caller() -> None:
        while len(answers) < total:
            mine = len(answers)
            answers.append(())
            answers[mine] = await chat(http, next(targets), **body)

    await asyncio.gather(*(caller() for _ in range(width)))
    return answers


async def metric(http, proc: Proc, name: str) -> float:
    async with http.get(f"{proc.url}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not exposed")


async def wait_for(predicate, timeout_s: float, step_s: float = 0.1) -> float:
    """Seconds until `predicate()` (a coroutine function) held; fails after `timeout_s`."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if await predicate():
            return time.monotonic() - began
        await asyncio.sleep(step_s)
    raise AssertionError(f"not within {timeout_s}s")


async def test_three_replicas_share_one_pool_under_a_flood(fleet, http, sim):
    replicas = fleet.start(3, pool={"max_concurrency": 8})
    answers = await flood(http, replicas, total=2100, width=48)
    codes = [code(a) for a in answers]
    stats = await sim_stats(http, sim)
    assert 6 <= stats["max_in_flight"] <= 8
    # The pool was used over and over, not once: how often depends on how fast this
    # machine refuses the rest (a faster one ends the flood sooner), so no more is asked.
    assert codes.count("ok") >= 16
    assert codes.count("pool_concurrency_limited") >= 500
    assert set(codes) <= {"ok", "pool_concurrency_limited"}


@pytest.mark.parametrize(
    ("limits", "refusal"),
    [
        ({"tenant": {"requests_per_minute": 60}}, "tenant_rate_limited"),
        ({"pool": {"max_concurrency": 64, "tokens_per_minute": 600}}, "pool_token_limited"),
    ],
)
async def test_a_rate_holds_over_the_fleet(fleet, http, limits, refusal):
    """Admitted <= 1.05 x (burst + rate x duration), the duration being the whole flood;
    three replicas each enforcing the limit alone would admit three bursts."""
    replicas = fleet.start(3, **{"pool": {"max_concurrency": 64}, **limits})
    began = time.monotonic()
    answers = await flood(http, replicas, total=600, width=24)
    elapsed = time.monotonic() - began
    ok = [a for a in answers if a[0] == 200]
    assert {code(a) for a in answers} == {"ok", refusal}
    if refusal == "tenant_rate_limited":
        assert 30 <= len(ok) <= 1.05 * (60 + 1.0 * elapsed)
    else:
        used = sum(a[2]["usage"]["total_tokens"] for a in ok)
        assert 300 <= used <= 1.05 * (600 + 10.0 * elapsed)


async def test_a_killed_replica_frees_its_permits_within_three_ttls(fleet, http, sim):
    holder, other = fleet.start(2, pool={"max_concurrency": 2})
    async with http.post(f"{sim.url}/sim/faults", json={"hang": True}) as resp:
        assert resp.status == 200
    held = [asyncio.ensure_future(chat(http, holder)) for _ in range(2)]
    await wait_for(lambda: _received(http, sim, 2), 5)
    assert code(await chat(http, other)) == "pool_concurrency_limited"
    os.kill(holder.popen.pid, signal.SIGKILL)
    holder.popen.wait(5)
    await asyncio.gather(*held, return_exceptions=True)
    async with http.delete(f"{sim.url}/sim/faults") as resp:
        assert resp.status == 200

    async def admitted() -> bool:
        return code(await chat(http, other)) == "ok"

    assert await wait_for(admitted, 3 * 1.0 + 2) <= 3 * 1.0 + 1


async def _received(http, sim, count: int) -> bool:
    return (await sim_stats(http, sim))["received"] >= count


async def test_a_stream_longer_than_three_ttls_keeps_its_lease(fleet, http, sim):
    one, two = fleet.start(2, pool={"max_concurrency": 1})
    client = openai.AsyncOpenAI(base_url=f"{one.url}/v1", api_key=KEY, max_retries=0)
    began = time.monotonic()
    stream = await client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=500, stream=True
    )
    refused: list[str] = []
    chunks = 0
    async for _ in stream:
        chunks += 1
        if chunks % 40 == 0:
            refused.append(code(await chat(http, two)))
    assert time.monotonic() - began > 3 * 1.0
    assert refused
    assert set(refused) == {"pool_concurrency_limited"}
    assert (await sim_stats(http, sim))["max_in_flight"] == 1
    assert code(await chat(http, two)) == "ok"


async def test_a_throttle_seen_by_one_replica_cools_the_pool_on_every_replica(fleet, http, sim):
    one, two = fleet.start(2, pool={"max_concurrency": 8})
    faults = {"throttle_rate": 1.0, "throttle_retry_after_s": 30}
    async with http.post(f"{sim.url}/sim/faults", json=faults) as resp:
        assert resp.status == 200
    assert code(await chat(http, one)) == "upstream_throttled"
    received = (await sim_stats(http, sim))["received"]
    status, headers, body = await chat(http, two)
    assert body["error"]["code"] == "pool_cooling_down"
    assert status == 503
    assert 25 <= int(headers["Retry-After"]) <= 31
    assert (await sim_stats(http, sim))["received"] == received


async def test_a_fleet_circuit_opened_by_failures_on_one_replica_refuses_on_the_other(
    fleet, http, sim
):
    breaker = {"scope": "fleet", "consecutive_failures": 3, "min_attempts": 1000, "open_s": 30}
    one, two = fleet.start(2, pool={"max_concurrency": 8}, breaker=breaker)
    async with http.post(f"{sim.url}/sim/faults", json={"error_rate": 1.0}) as resp:
        assert resp.status == 200
    assert [code(await chat(http, one)) for _ in range(3)] == ["upstream_error"] * 3
    received = (await sim_stats(http, sim))["received"]
    await asyncio.sleep(1.0)
    status, headers, body = await chat(http, two)
    assert (status, body["error"]["code"]) == (503, "circuit_open")
    assert int(headers["Retry-After"]) >= 20
    assert (await sim_stats(http, sim))["received"] == received


async def test_a_slot_freed_on_one_replica_wakes_the_queue_of_another(fleet, http, sim):
    """Without the announcement the queued request would wait for a wake-up of its own
    replica (none comes) and expire after its 8 s."""
    lanes = [{"name": "interactive", "queue_size": 8, "max_queue_age_s": 8}]
    one, two = fleet.start(2, pool={"max_concurrency": 1}, lanes=lanes)
    holding = asyncio.ensure_future(chat(http, one, max_tokens=60))
    await wait_for(lambda: _received(http, sim, 1), 5, step_s=0.02)
    began = time.monotonic()
    queued = await chat(http, two)
    waited = time.monotonic() - began
    assert code(await holding) == "ok"
    assert code(queued) == "ok"
    assert waited < 3


async def test_replicas_together_keep_the_backend_queue_within_the_lanes_bound(http, tmp_path):
    """A backend of 2 sequences scraped once a second, and a lane that sends only into an
    empty queue: each replica alone would let 3 through between two scrapes (6 for two);
    the fleet's bound lets 3 through for both together."""
    small = start(
        "sim", ["--model", "sim-model", "--api-key", SIM_KEY, "--max-num-seqs", "2"], tmp_path
    )
    async with redis_or_skip() as (_, prefix):
        group = Fleet(tmp_path, small, REDIS_URL, prefix)
        try:
            metrics = {"interval_s": 1.0, "stale_after_s": 5.0, "max_num_seqs": 2}
            replicas = group.start(
                2,
                pool={"max_concurrency": 64},
                lanes=[{"name": "interactive", "max_backend_waiting": 0}],
                deployment={"metrics": metrics},
            )
            await asyncio.sleep(1.5)
            answers = await flood(http, replicas, total=1500, width=16, max_tokens=30)
            codes = [code(a) for a in answers]
            assert codes.count("ok") >= 3
            assert codes.count("backend_busy") >= 100
            assert (await sim_stats(http, small))["max_in_flight"] <= 3
        finally:
            group.stop()
            small.stop()


async def test_replicas_send_one_long_prompt_at_a_time_until_the_budget_has_a_measure(
    http, tmp_path
):
    """The prefill budget is the deployment's, not each replica's: before any first token
    has measured the backend's prefill, one streamed prompt goes at a time, whichever
    replica holds it. A backend prefilling 4,000 tokens in 2 s: while replica one's
    prompt prefills, replica two's waits in its queue; it goes once the first token has
    measured the prefill, woken by the budget's announcement while the first answer
    still streams (its pool slot still held), and both are answered."""
    slow = start(
        "sim",
        ["--model", "sim-model", "--api-key", SIM_KEY, "--prefill-ms-per-token", "0.5"],
        tmp_path,
    )
    async with redis_or_skip() as (_, prefix):
        group = Fleet(tmp_path, slow, REDIS_URL, prefix)
        try:
            lanes = [
                {"name": "interactive", "ttft_slo_s": 10, "queue_size": 8, "max_queue_age_s": 30}
            ]
            # Local fairness: the fleet's fairness sync would wake the queue every 0.1 s.
            scheduling = {"fairness_scope": "local"}
            one, two = group.start(
                2, pool={"max_concurrency": 8}, lanes=lanes, scheduling=scheduling
            )
            long_prompt = [{"role": "user", "content": "x" * 16_000}]
            first = asyncio.ensure_future(
                chat_stream(http, one, messages=long_prompt, max_tokens=300)
            )
            await wait_for(lambda: _received(http, slow, 1), 5, step_s=0.02)
            second = asyncio.ensure_future(
                chat_stream(http, two, messages=long_prompt, max_tokens=2)
            )
            await asyncio.sleep(0.5)
            assert (await sim_stats(http, slow))["received"] == 1, "held by the budget"
            await wait_for(lambda: _received(http, slow, 2), 10, step_s=0.02)
            assert not first.done(), "woken by the first token, not by the end of the stream"
            assert await asyncio.wait_for(asyncio.gather(first, second), 30) == [200, 200]
        finally:
            group.stop()
            slow.stop()


async def chat_stream(http: aiohttp.ClientSession, proc: Proc, **body) -> int:
    """A streamed chat read to its end; its status."""
    payload = {"model": "chat", "stream": True, **body}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.post(f"{proc.url}/v1/chat/completions", json=payload, headers=headers) as resp:
        await resp.read()
        return resp.status


@pytest.mark.parametrize("scope", ["fleet", "local"])
async def test_tenants_split_over_two_replicas_share_one_pool_fairly(fleet, http, scope):
    """A's callers reach replica 1 only, B's and C's replica 2 only, all backlogged on one
    pool: with fleet fairness each gets about a third of the tokens. With local fairness
    each replica orders only its own tenants, and the pool's shared line gives each freed
    slot to the replica waiting longest, so each replica gets about half: A about 0.5.
    Before the line, the replica freeing a slot took it again first, and A, alone on its
    replica, got from 0.07 (starved for 8 s) to 0.6 as the first slots fell."""
    one, two = fleet.start(
        2,
        pool={"max_concurrency": 4},
        tenants=("a", "b", "c"),
        lanes=[{"name": "interactive", "queue_size": 64, "max_queue_age_s": 30}],
        scheduling={"fairness_scope": scope},
    )
    served = {"a": 0, "b": 0, "c": 0}
    stop_at = time.monotonic() + 8.0

    async def caller(tenant: str, replica: Proc) -> None:
        while time.monotonic() < stop_at:
            status, _, body = await chat(http, replica, max_tokens=24, tenant=tenant)
            if status == 200 and time.monotonic() > stop_at - 6.0:
                served[tenant] += body["usage"]["completion_tokens"]

    callers = [caller("a", one) for _ in range(6)]
    callers += [caller(t, two) for t in ("b", "c") for _ in range(6)]
    await asyncio.gather(*callers)
    total = sum(served.values())
    shares = {tenant: tokens / total for tenant, tokens in served.items()}
    if scope == "fleet":
        assert all(0.27 <= share <= 0.40 for share in shares.values()), shares
    else:
        assert 0.38 <= shares["a"] <= 0.62, shares
        assert min(shares.values()) >= 0.15, shares


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator:
    with redis_server(tmp_path) as server:
        yield server


async def test_redis_killed_mid_run_each_replica_enforces_its_share_then_converges(
    sim, http, tmp_path, own_redis
):
    async with http.post(f"{sim.url}/sim/reset") as resp:
        assert resp.status == 200
    group = Fleet(tmp_path, sim, own_redis.url, "fleet:")
    try:
        one, two = group.start(2, pool={"max_concurrency": 4}, probe_s=0.2)
        await wait_for(lambda: _live(http, one, 2), 5)
        async with http.post(f"{sim.url}/sim/faults", json={"hang": True}) as resp:
            assert resp.status == 200
        own_redis.kill()
        held = []
        for replica in (one, two):
            for _ in range(4):
                held.append(asyncio.ensure_future(chat(http, replica)))
            await asyncio.sleep(0.5)
        await wait_for(lambda: _received(http, sim, 4), 5)
        await asyncio.sleep(0.3)
        assert (await sim_stats(http, sim))["received"] == 4
        done = [task.result() for task in held if task.done()]
        assert [code(a) for a in done] == ["pool_concurrency_limited"] * 4
        assert all(a[1]["x-sluicegate-degraded"] == "store" for a in done)
        assert await metric(http, one, "sluicegate_store_degraded") == 1.0
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        async with http.delete(f"{sim.url}/sim/faults") as resp:
            assert resp.status == 200

        own_redis.start()
        for replica in (one, two):
            await wait_for(lambda r=replica: _shared_again(http, r), 10)
        answer = await chat(http, two)
        assert code(answer) == "ok"
        assert "x-sluicegate-degraded" not in answer[1]
        assert "limit store is reachable again" in one.output()
    finally:
        group.stop()
        async with http.delete(f"{sim.url}/sim/faults") as resp:
            assert resp.status == 200


@pytest.mark.parametrize("when_down", ["fail_closed", "fail_open"])
async def test_redis_killed_with_the_other_policies_refuses_or_stops_enforcing(
    sim, http, tmp_path, own_redis, when_down
):
    async with http.post(f"{sim.url}/sim/reset") as resp:
        assert resp.status == 200
    group = Fleet(tmp_path, sim, own_redis.url, "fleet:")
    try:
        down = {"concurrency": when_down, "rates": "local_share"}
        (replica,) = group.start(1, pool={"max_concurrency": 1}, when_down=down)
        assert code(await chat(http, replica)) == "ok"
        async with http.post(f"{sim.url}/sim/faults", json={"hang": True}) as resp:
            assert resp.status == 200
        own_redis.kill()
        held = [asyncio.ensure_future(chat(http, replica)) for _ in range(3)]
        if when_down == "fail_closed":
            answers = await asyncio.gather(*held)
            assert {(a[0], code(a)) for a in answers} == {(503, "limit_store_unavailable")}
            assert all(a[1]["x-sluicegate-degraded"] == "store" for a in answers)
        else:
            await wait_for(lambda: _received(http, sim, 4), 5)
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
    finally:
        group.stop()
        async with http.delete(f"{sim.url}/sim/faults") as resp:
            assert resp.status == 200


async def _live(http, proc: Proc, count: int) -> bool:
    return await metric(http, proc, "sluicegate_store_live_replicas") >= count


async def _shared_again(http, proc: Proc) -> bool:
    return await metric(http, proc, "sluicegate_store_degraded") == 0.0


async def test_a_replica_refuses_to_start_without_redis_when_told_to(sim, tmp_path):
    group = Fleet(tmp_path, sim, "redis://127.0.0.1:1/0", "x:")
    with pytest.raises(RuntimeError, match=r"Redis at 127.0.0.1:1 is unreachable .*at_start: fail"):
        group.start(1, pool={"max_concurrency": 1}, at_start="fail")


async def test_a_replica_starts_degraded_without_redis_and_says_so(sim, http, tmp_path):
    group = Fleet(tmp_path, sim, "redis://127.0.0.1:1/0", "x:")
    try:
        (replica,) = group.start(1, pool={"max_concurrency": 1}, expected_replicas=2)
        assert "starting degraded" in replica.output()
        answer = await chat(http, replica)
        assert code(answer) == "ok"
        assert answer[1]["x-sluicegate-degraded"] == "store"
    finally:
        group.stop()


async def test_two_busy_replicas_share_again_within_5s_of_a_paused_redis_answering(
    sim, http, tmp_path, own_redis
):
    """200 requests per second over two replicas while Redis is paused for 1.5 s
    (SIGSTOP: nothing answered, nothing refused): both degrade on late answers, and both
    decide in the shared store again within 5 s of Redis answering, under the same load.
    Leases last the default 30 s (a heartbeat every 10 s); calls to Redis are bounded at
    0.25 s (not the 1 s of the other fleet tests, so that the pause is an outage; still
    past the loop lag a flood brings on this machine). The pool (256, 128 a replica while
    degraded) holds the flood's requests even when a busy machine makes every answer
    slower: with 64, a neighbouring test's load was enough for a pool refusal."""
    async with http.post(f"{sim.url}/sim/reset") as resp:
        assert resp.status == 200
    group = Fleet(tmp_path, sim, own_redis.url, "fleet:")
    try:
        replicas = group.start(
            2, pool={"max_concurrency": 256}, timeout_s=0.25, probe_s=0.5, lease_ttl_s=30
        )
        await wait_for(lambda: _live(http, replicas[1], 2), 5)
        answers: list[tuple] = []
        load = asyncio.ensure_future(paced(http, replicas, per_s=200, answers=answers))
        await asyncio.sleep(1.0)
        own_redis.pause()
        try:
            for replica in replicas:
                await wait_for(lambda r=replica: _degraded(http, r), 5, step_s=0.05)
            await asyncio.sleep(1.0)
        finally:
            own_redis.resume()
        took = await wait_for(lambda: _all_shared_again(http, replicas), 10, step_s=0.05)
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        assert took <= 5.0, f"shared again {took:.1f}s after Redis answered"
        assert len(answers) >= 200
        assert {code(a) for a in answers} <= {"ok", "limit_store_unavailable"}
        assert "x-sluicegate-degraded" not in (await chat(http, replicas[1]))[1]
    finally:
        group.stop()


async def paced(http, replicas: list[Proc], per_s: float, answers: list[tuple]) -> None:
    """Requests at `per_s`, round robin over the replicas, each in a task of its own,
    until cancelled (the requests in flight then too); a request the client could not
    complete is answered with its error as the code."""

    async def one(replica: Proc) -> None:
        try:
            answers.append(await chat(http, replica))
        except aiohttp.ClientError as exc:
            answers.append((0, {}, {"error": {"code": repr(exc)}}))

    running: set[asyncio.Task] = set()
    began = time.monotonic()
    try:
        for sent, replica in enumerate(itertools.cycle(replicas)):
            await asyncio.sleep(max(0.0, began + sent / per_s - time.monotonic()))
            task = asyncio.ensure_future(one(replica))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def _degraded(http, proc: Proc) -> bool:
    return await metric(http, proc, "sluicegate_store_degraded") == 1.0


async def _all_shared_again(http, replicas: list[Proc]) -> bool:
    return all([await _shared_again(http, replica) for replica in replicas])
