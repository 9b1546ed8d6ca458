"""Guardrails between a real gateway and the simulator, with a classifier over HTTP run
by the test: a masked address never reaches the simulator, a block and a fail-closed
check refuse before it, a slow audit fails open, and a streamed answer whose later text
fails its post-call check ends with an error event and none of that text."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Iterator

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from tests.e2e.conftest import SIM_KEY, gateway_config
from tests.support.processes import Proc, start
from tests.support.webapp import serving

CAROL = "sk-test-carol"
DAVE = "sk-test-dave"
ERIN = "sk-test-erin"
FAY = "sk-test-fay"
GUS = "sk-test-gus"
HAL = "sk-test-hal"
IVY = "sk-test-ivy"
EMAIL = r"[\w.]+@[\w.]+\.\w+"


async def pii(request: web.Request) -> web.Response:
    text = (await request.json())["text"]
    spans = [
        {"start": m.start(), "end": m.end(), "kind": "email"} for m in re.finditer(EMAIL, text)
    ]
    return web.json_response({"flagged": bool(spans), "spans": spans})


async def down(request: web.Request) -> web.Response:
    return web.Response(status=500)


async def slow(request: web.Request) -> web.Response:
    await asyncio.sleep(5)
    return web.json_response({"flagged": True})


@pytest.fixture(scope="module")
async def classifier() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/pii", pii)
    app.router.add_post("/down", down)
    app.router.add_post("/slow", slow)
    async with serving(app) as url:
        yield url


def tenant(name: str, key: str) -> dict:
    return {"name": name, "keys": [{"sha256": hashlib.sha256(key.encode()).hexdigest()}]}


@pytest.fixture(scope="module")
def guarded(sim: Proc, classifier: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    def http(path: str) -> dict:
        return {"kind": "http", "url": f"{classifier}{path}"}

    def patterns(kind: str, expression: str) -> dict:
        return {
            "kind": "plugin",
            "path": "sluicegate.guardrails.patterns:Patterns",
            "options": {"patterns": {kind: expression}},
        }

    config = gateway_config(sim.url)
    config["tenants"] += [tenant("carol", CAROL), tenant("dave", DAVE), tenant("erin", ERIN)]
    config["tenants"] += [
        {**tenant("fay", FAY), "limits": {"tokens_per_minute": 300}},
        tenant("gus", GUS),
        tenant("hal", HAL),
        tenant("ivy", IVY),
    ]
    config["guardrails"] = {
        "checks": [
            {"name": "pii", "checker": http("/pii"), "action": "mask", "placement": "pre_call"},
            {
                "name": "secret",
                "checker": patterns("key", "sk-[a-z]{8}"),
                "action": "block",
                "placement": "pre_call",
            },
            {
                "name": "down",
                "checker": http("/down"),
                "action": "block",
                "placement": "pre_call",
            },
            {
                "name": "slow-audit",
                "checker": http("/slow"),
                "action": "audit",
                "placement": "pre_call",
                "budget_s": 0.2,
            },
            {
                "name": "par",
                "checker": patterns("word", "forbidden"),
                "action": "block",
                "placement": "parallel",
            },
            {
                "name": "lorem",
                "checker": patterns("lorem", "tempor incididunt"),
                "action": "block",
                "placement": "post_call",
                "window": 32,
            },
            {
                "name": "pii-kinds",
                "checker": {"kind": "pii", "kinds": ["email", "card"]},
                "action": "mask",
                "placement": "pre_call",
            },
            {
                "name": "terms",
                "checker": {"kind": "banned_terms", "terms": ["Eiusmod"]},
                "action": "block",
                "placement": "post_call",
                "window": 16,
            },
        ],
        "apply": [
            {"guardrails": ["pii", "secret"], "tenants": ["carol"]},
            {"guardrails": ["down"], "tenants": ["dave"]},
            {"guardrails": ["slow-audit", "lorem"], "tenants": ["erin"]},
            {"guardrails": ["secret"], "tenants": ["fay"]},
            {"guardrails": ["par"], "tenants": ["gus"]},
            {"guardrails": ["pii-kinds"], "tenants": ["hal"]},
            {"guardrails": ["terms"], "tenants": ["ivy"]},
        ],
    }
    folder = tmp_path_factory.mktemp("guarded")
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"SIM_KEY": SIM_KEY, "BAD_KEY": "x", "ALICE_KEY": "sk-test-alice"}
    proc = start("serve", ["--config", str(path)], folder, env=env, ready_path="/ready")
    yield proc
    proc.stop()


def chat(content: str, max_tokens: int = 4, stream: bool = False) -> dict:
    return {
        "model": "chat",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def post(
    http: aiohttp.ClientSession, gateway: Proc, key: str, body: dict
) -> tuple[int, bytes]:
    headers = {"authorization": f"Bearer {key}"}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, await r.read()


async def bodies(http: aiohttp.ClientSession, sim: Proc) -> list[dict]:
    async with http.get(f"{sim.url}/sim/bodies") as resp:
        return await resp.json()


async def test_a_masked_address_never_reaches_the_model(
    guarded: Proc, sim: Proc, http: aiohttp.ClientSession
) -> None:
    marker = "mask-test-7f3a"
    status, _ = await post(http, guarded, CAROL, chat(f"{marker} write to bob@example.com"))
    assert status == 200
    sent = [b for b in await bodies(http, sim) if marker in orjson.dumps(b).decode()]
    assert len(sent) == 1
    assert sent[0]["messages"][0]["content"] == f"{marker} write to [EMAIL]"


async def test_the_built_in_pii_kind_masks_an_address_and_a_card_before_the_model(
    guarded: Proc, sim: Proc, http: aiohttp.ClientSession
) -> None:
    marker = "pii-kind-93be"
    prompt = f"{marker} mail bob@example.com, card 4111 1111 1111 1111, order 4111 1111"
    status, _ = await post(http, guarded, HAL, chat(prompt))
    assert status == 200
    sent = [b for b in await bodies(http, sim) if marker in orjson.dumps(b).decode()]
    assert [b["messages"][0]["content"] for b in sent] == [
        f"{marker} mail [EMAIL], card [CARD], order 4111 1111"
    ]


async def test_the_built_in_banned_terms_kind_cuts_a_stream_before_the_term(
    guarded: Proc, http: aiohttp.ClientSession
) -> None:
    status, raw = await post(http, guarded, IVY, chat("hello", max_tokens=40, stream=True))
    assert status == 200
    parsed = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    assert parsed[-1]["error"]["code"] == "guardrail_blocked"
    assert "'terms'" in parsed[-1]["error"]["message"]
    assert parsed[-2]["choices"][0]["finish_reason"] == "content_filter"
    assert b"eiusmod" not in raw
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in parsed[:-2])
    before = " lorem ipsum dolor sit amet consectetur adipiscing elit sed do"
    assert before.startswith(text)
    assert len(before) - len(text) <= 16  # never more than the window behind


async def test_a_block_refuses_before_the_model_naming_the_guardrail(
    guarded: Proc, sim: Proc, http: aiohttp.ClientSession
) -> None:
    before = len(await bodies(http, sim))
    status, body = await post(http, guarded, CAROL, chat("my key is sk-abcdefgh"))
    error = orjson.loads(body)["error"]
    assert (status, error["code"]) == (400, "guardrail_blocked")
    assert "'secret'" in error["message"]
    assert "sk-abcdefgh" not in body.decode()
    assert len(await bodies(http, sim)) == before


async def test_a_fail_closed_check_that_cannot_run_refuses_with_503(
    guarded: Proc, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, guarded, DAVE, chat("hello"))
    error = orjson.loads(body)["error"]
    assert (status, error["code"]) == (503, "guardrail_unavailable")
    assert "'down'" in error["message"]


async def test_a_slow_audit_fails_open_and_a_clean_answer_passes(
    guarded: Proc, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, guarded, ERIN, chat("hello", max_tokens=5))
    assert status == 200
    content = orjson.loads(body)["choices"][0]["message"]["content"]
    assert content == " lorem ipsum dolor sit amet"


async def test_a_non_streamed_answer_that_fails_its_post_call_check_is_refused(
    guarded: Proc, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, guarded, ERIN, chat("hello", max_tokens=16))
    assert status == 400
    assert orjson.loads(body)["error"]["code"] == "guardrail_blocked"
    assert b"tempor" not in body


async def test_a_stream_is_cut_before_text_that_fails_its_check(
    guarded: Proc, http: aiohttp.ClientSession
) -> None:
    status, raw = await post(http, guarded, ERIN, chat("hello", max_tokens=40, stream=True))
    assert status == 200
    events = [e[len(b"data: ") :] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    parsed = [orjson.loads(e) for e in events]
    assert "error" in parsed[-1]
    assert parsed[-1]["error"]["code"] == "guardrail_blocked"
    assert parsed[-2]["choices"][0]["finish_reason"] == "content_filter"
    text = "".join(
        (e["choices"][0]["delta"].get("content") or "") for e in parsed[:-2] if e.get("choices")
    )
    assert "incididunt" not in text
    assert "tempor incididunt" not in raw.decode()
    assert (" lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod").startswith(
        text
    )


async def test_guardrail_decisions_are_counted(guarded: Proc, http: aiohttp.ClientSession) -> None:
    await post(http, guarded, CAROL, chat("reach me at a@b.co"))
    await post(http, guarded, ERIN, chat("hello", max_tokens=2))
    async with http.get(f"{guarded.url}/metrics") as resp:
        page = await resp.text()
    assert 'sluicegate_guardrail_decisions_total{guardrail="pii",outcome="flagged"}' in page
    assert 'sluicegate_guardrail_timeouts_total{guardrail="slow-audit"}' in page


async def test_a_request_blocked_before_the_model_gives_its_reservation_back(
    guarded: Proc, http: aiohttp.ClientSession
) -> None:
    for _ in range(4):
        status, _ = await post(http, guarded, FAY, chat("sk-abcdefgh", max_tokens=200))
        assert status == 400
    status, body = await post(http, guarded, FAY, chat("clean", max_tokens=200))
    assert status == 200, body


@pytest.mark.parametrize("stream", [False, True])
async def test_a_parallel_check_refuses_before_the_answer_is_handed_over(
    guarded: Proc, http: aiohttp.ClientSession, stream: bool
) -> None:
    status, body = await post(http, guarded, GUS, chat("a forbidden word", stream=stream))
    error = orjson.loads(body)["error"]
    assert (status, error["code"]) == (400, "guardrail_blocked")
    assert "'par'" in error["message"]
    status, _ = await post(http, guarded, GUS, chat("fine words", stream=stream))
    assert status == 200


async def test_jobs_pass_the_same_guardrails(
    sim: Proc, http: aiohttp.ClientSession, tmp_path: pytest.TempPathFactory
) -> None:
    from tests.support.jobs import JobClient, sqlite_jobs, start_gateway
    from tests.support.jobs import chat as job_chat
    from tests.support.jobs import gateway_config as job_config

    def patterns(expression: str) -> dict:
        return {
            "kind": "plugin",
            "path": "sluicegate.guardrails.patterns:Patterns",
            "options": {"patterns": {"key": expression}},
        }

    config = job_config(sim, sqlite_jobs(tmp_path))
    config["guardrails"] = {
        "checks": [
            {"name": "keys", "checker": patterns("sk-[a-z]{8}"), "action": "mask",
             "placement": "pre_call"},
            {"name": "words", "checker": patterns("forbidden"), "action": "block",
             "placement": "pre_call"},
        ],
        "apply": [{"guardrails": ["keys", "words"]}],
    }  # fmt: skip
    gateway = start_gateway(tmp_path, config)
    try:
        jobs = JobClient(http, gateway, "alice")
        marker = "job-mask-51c2"
        masked = await jobs.accepted(
            job_chat(messages=[{"role": "user", "content": f"{marker} sk-abcdefgh"}])
        )
        blocked = await jobs.accepted(job_chat(messages=[{"role": "user", "content": "forbidden"}]))
        done = await jobs.final([masked["id"], blocked["id"]])
        assert done[masked["id"]]["status"] == "succeeded"
        assert done[blocked["id"]]["status"] == "failed"
        assert done[blocked["id"]]["error"]["code"] == "guardrail_blocked"
        sent = [b for b in await bodies(http, sim) if marker in orjson.dumps(b).decode()]
        assert [b["messages"][0]["content"] for b in sent] == [f"{marker} [KEY]"]
    finally:
        gateway.stop()


async def test_guardrail_time_is_a_stage_of_its_own(
    guarded: Proc, http: aiohttp.ClientSession
) -> None:
    async def timing(key: str) -> str:
        headers = {"authorization": f"Bearer {key}"}
        url = f"{guarded.url}/v1/chat/completions"
        async with http.post(url, json=chat("hello", max_tokens=2), headers=headers) as resp:
            assert resp.status == 200
            return resp.headers["server-timing"]

    assert "guardrail;dur=" in await timing(CAROL)
    assert "answer_check;dur=" in await timing(ERIN)
    plain = await timing("sk-test-alice")
    assert "guardrail" not in plain
    assert "answer_check" not in plain
