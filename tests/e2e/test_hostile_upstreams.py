"""Hostile upstreams as simulator faults: a real gateway in front of a lying `sluicegate sim`
answers every lie with a clean OpenAI-shaped error, follows no redirect, trusts no
Retry-After without bound, and keeps scraping a backend whose metrics are garbage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from tests.e2e.conftest import ALICE, SIM_KEY
from tests.support.jobs import JobClient, gateway_config, sqlite_jobs, start_gateway
from tests.support.processes import Proc, start

MESSAGES = [{"role": "user", "content": "hello"}]
AUTH = {"Authorization": f"Bearer {ALICE}"}
MAX_COOLDOWN_S = 2
NOT_OPENED = {"consecutive_failures": 1000, "min_attempts": 1000, "ramp_s": 0}


def deployment(name: str, sim: Proc, **extra: object) -> dict:
    return {
        "name": name,
        "base_url": f"{sim.url}/v1",
        "model": "sim-model",
        "api_key_env": "SIM_KEY",
        "breaker": NOT_OPENED,
        **extra,
    }


def serve(folder, config: dict) -> Proc:
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"SIM_KEY": SIM_KEY, "ALICE_KEY": ALICE}
    return start("serve", ["--config", str(path)], folder, env=env, ready_path="/ready")


@pytest.fixture(scope="module")
def liar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start(
        "sim", ["--model", "sim-model", "--api-key", SIM_KEY], tmp_path_factory.mktemp("liar")
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gateway(liar: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    metrics = {"interval_s": 0.1, "on_stale": "pools"}
    config = {
        "routes": {"chat": {"retry": {"max_attempts": 1}}},
        "models": [
            {
                "name": "chat",
                "deployments": [
                    deployment(
                        "liar",
                        liar,
                        timeouts={"connect_s": 1, "read_s": 2, "total_s": 10},
                        max_response_bytes=64 * 1024,
                        metrics=metrics,
                    )
                ],
            },
            {
                "name": "cooling",
                "deployments": [deployment("cooling", liar, max_cooldown_s=MAX_COOLDOWN_S)],
            },
        ],
        "tenants": [{"name": "alice", "keys": [{"env": "ALICE_KEY"}]}],
    }
    proc = serve(tmp_path_factory.mktemp("gateway"), config)
    yield proc
    proc.stop()
    assert "Traceback" not in proc.output()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


@pytest.fixture
async def lies(liar: Proc, http: aiohttp.ClientSession):
    async def apply(**settings: object) -> None:
        async with http.post(f"{liar.url}/sim/faults", json=settings) as resp:
            assert resp.status == 200, await resp.text()

    yield apply
    async with http.delete(f"{liar.url}/sim/faults") as resp:
        assert resp.status == 200


async def chat(http: aiohttp.ClientSession, gateway: Proc, **body: object):
    payload = {"model": "chat", "messages": MESSAGES, "max_tokens": 4, **body}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=payload, headers=AUTH) as r:
        return r.status, r.headers, await r.read()


async def error_of(http: aiohttp.ClientSession, gateway: Proc, **body: object):
    status, headers, raw = await chat(http, gateway, **body)
    return status, headers, orjson.loads(raw)["error"]


def await_json(raw: bytes) -> dict:
    import orjson

    return orjson.loads(raw)


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "1000000000"])
async def test_a_throttles_retry_after_is_bounded_and_never_a_500(http, gateway, lies, value):
    """`inf` once crashed error rendering into a bare 500; 1e9 cooled the pool for 31
    years, and every later request was told to come back then."""
    await lies(throttle_rate=1, retry_after_header=value)
    status, headers, error = await error_of(http, gateway, model="cooling")
    assert (status, error["code"]) == (503, "upstream_throttled")
    assert 0 <= int(headers.get("retry-after", "0")) <= MAX_COOLDOWN_S
    await lies(throttle_rate=0, retry_after_header=None)
    async with asyncio.timeout(MAX_COOLDOWN_S + 3):
        while (answer := await chat(http, gateway, model="cooling"))[0] != 200:
            status, headers, raw = answer
            assert orjson.loads(raw)["error"]["code"] == "pool_cooling_down"
            assert int(headers["retry-after"]) <= MAX_COOLDOWN_S
            await asyncio.sleep(0.2)


@pytest.fixture
async def elsewhere() -> AsyncIterator[tuple[str, list[dict]]]:
    """Another origin, recording what reaches it."""
    seen: list[dict] = []

    async def record(request: web.Request) -> web.Response:
        seen.append({"headers": dict(request.headers), "body": await request.read()})
        return web.json_response({"choices": [{"message": {"content": "not the model"}}]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/steal", seen
    await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_redirect_is_never_followed(http, gateway, lies, elsewhere, stream):
    url, seen = elsewhere
    await lies(redirect_to=url)
    status, _, error = await error_of(http, gateway, stream=stream)
    assert (status, error["code"]) == (502, "upstream_misconfigured")
    await asyncio.sleep(0.3)
    assert seen == []


@pytest.mark.parametrize(
    ("lie", "stream", "code"),
    [
        ("invalid_json", False, "upstream_malformed"),
        ("html", False, "upstream_malformed"),
        ("html", True, "upstream_malformed"),
        ("gzip", False, "upstream_malformed"),
        ("gzip", True, "upstream_malformed"),
        ("oversized", False, "upstream_malformed"),
        ("short", False, "upstream_interrupted"),
    ],
)
async def test_a_lying_body_is_a_clean_502(http, gateway, lies, lie, stream, code):
    await lies(body_lie=lie)
    status, headers, error = await error_of(http, gateway, stream=stream)
    assert (status, error["code"]) == (502, code)
    assert headers["content-type"] == "application/json"


async def metric(http: aiohttp.ClientSession, gateway: Proc, reason: str) -> float:
    async with http.get(f"{gateway.url}/metrics") as resp:
        text = await resp.text()
    prefix = f'sluicegate_backend_scrape_failures_total{{deployment="liar",reason="{reason}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ({"metrics_lie": "garbage"}, "malformed"),
        ({"metrics_lie": "nan"}, "malformed"),
        ({"metrics_lie": "huge"}, "too_large"),
        ({"redirect_to": "http://127.0.0.1:9/metrics"}, "status"),
    ],
)
async def test_a_malformed_scrape_is_counted_and_the_poller_lives_on(
    http, gateway, lies, fault, reason
):
    before = await metric(http, gateway, reason)
    await lies(**fault)
    async with asyncio.timeout(10):
        while await metric(http, gateway, reason) < before + 2:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    await lies(metrics_lie=None, redirect_to=None)
    status, _, _ = await chat(http, gateway)
    assert status == 200


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """About 20 ms per token: 100 tokens take about 2 s."""
    args = ["--model", "sim-model", "--api-key", SIM_KEY, "--step-base-ms", "20"]
    proc = start("sim", args, tmp_path_factory.mktemp("slow"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def patient(slow_sim: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """First bytes due in 0.5 s, hedged after 0.3 s, each output token allowed 0.05 s."""
    timeouts = {"connect_s": 1, "read_s": 1, "first_byte_s": 0.5, "output_token_s": 0.05}
    config = {
        "routes": {"chat": {"retry": {"max_attempts": 2}, "hedge_after_s": 0.3}},
        "models": [
            {
                "name": "chat",
                "deployments": [
                    deployment(name, slow_sim, timeouts=timeouts) for name in ("a", "b")
                ],
            }
        ],
        "tenants": [{"name": "alice", "keys": [{"env": "ALICE_KEY"}]}],
    }
    proc = serve(tmp_path_factory.mktemp("patient"), config)
    yield proc
    proc.stop()


async def test_a_long_non_streamed_answer_is_neither_timed_out_nor_hedged(http, patient, slow_sim):
    """vLLM sends a non-streamed answer's headers with its body: 100 tokens (about 2 s)
    once always passed `first_byte_s`, and `hedge_after_s` sent every one twice."""
    status, _, raw = await chat(http, patient, max_tokens=100)
    assert status == 200, raw
    assert orjson.loads(raw)["usage"]["completion_tokens"] == 100
    async with http.get(f"{slow_sim.url}/sim/stats") as resp:
        assert (await resp.json())["received"] == 1


async def test_a_lying_answer_never_becomes_a_stored_jobs_result(http, liar, lies, tmp_path):
    """A cut JSON body once was stored as the job's result, and every poll of the job
    answered with invalid JSON."""
    patient = {"backoff_base_s": 0.05, "backoff_cap_s": 0.2, "max_attempts": 50}
    gateway = start_gateway(tmp_path, gateway_config(liar, sqlite_jobs(tmp_path, **patient)))
    try:
        jobs = JobClient(http, gateway, "alice")
        await lies(body_lie="invalid_json")
        job = await jobs.accepted()
        back = await jobs.wait(job["id"], {"queued"}, with_error=True)
        assert back["last_error"]["code"] == "upstream_malformed"
        await lies(body_lie=None)
        done = await jobs.wait(job["id"], {"succeeded"})
        assert done["result"]["choices"][0]["message"]["content"]
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.output()
