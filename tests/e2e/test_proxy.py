"""The OpenAI-compatible proxy through real processes, driven by the official SDK and raw HTTP."""

from __future__ import annotations

import re

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ALICE, MAX_BODY, SIM_KEY, gateway_config, sim_stats
from tests.support.processes import start

MESSAGES = [{"role": "user", "content": "Say something."}]


async def test_non_streaming_chat(alice: openai.AsyncOpenAI):
    reply = await alice.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=7)
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens == 7
    assert reply.choices[0].finish_reason == "length"


async def test_streaming_chat_with_usage(alice: openai.AsyncOpenAI):
    stream = await alice.chat.completions.create(
        model="chat",
        messages=MESSAGES,
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert len(pieces) == 9
    assert usage is not None
    assert usage.completion_tokens == 9


async def test_completions_and_embeddings(alice: openai.AsyncOpenAI):
    text = await alice.completions.create(model="chat", prompt="Once upon", max_tokens=4)
    assert text.usage.completion_tokens == 4
    streamed = await alice.completions.create(model="chat", prompt="x", max_tokens=3, stream=True)
    assert len([c async for c in streamed if c.choices and c.choices[0].text]) == 3
    vectors = await alice.embeddings.create(model="embed", input=["a", "b"])
    assert len(vectors.data) == 2
    assert vectors.data[0].embedding


async def test_models_listed_per_tenant(alice: openai.AsyncOpenAI, bob: openai.AsyncOpenAI):
    assert {m.id async for m in alice.models.list()} == {"chat", "embed", "private", "miswired"}
    assert {m.id async for m in bob.models.list()} == {"chat", "embed"}


async def test_a_model_is_retrieved_as_its_tenant_sees_the_list(
    alice: openai.AsyncOpenAI, bob: openai.AsyncOpenAI
):
    """`GET /v1/models/{id}`: a model in the tenant's list is found; one it may not use is
    as absent as one that does not exist (the list does not show it either)."""
    chat = await alice.models.retrieve("chat")
    assert (chat.id, chat.object, chat.owned_by) == ("chat", "model", "sluicegate")
    assert (await alice.models.retrieve("private")).id == "private"
    for tenant, name in ((bob, "private"), (alice, "nowhere")):
        with pytest.raises(openai.NotFoundError) as info:
            await tenant.models.retrieve(name)
        assert info.value.code == "model_not_found"


async def test_stream_bytes_pass_through_unchanged(gateway, sim, http: aiohttp.ClientSession):
    """The gateway relays the upstream's SSE bytes; only ids and timestamps differ per request."""
    body = {"messages": MESSAGES, "max_tokens": 5, "stream": True}

    async def fetch(url: str, key: str, model: str) -> str:
        headers = {"Authorization": f"Bearer {key}"}
        async with http.post(url, json={**body, "model": model}, headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            text = (await resp.read()).decode()
        return re.sub(r'"(id|created)":("[^"]*"|\d+)', "", text)

    direct = await fetch(f"{sim.url}/v1/chat/completions", SIM_KEY, "sim-model")
    proxied = await fetch(f"{gateway.url}/v1/chat/completions", ALICE, "chat")
    assert proxied == direct
    assert '"model":"sim-model"' in proxied


@pytest.mark.parametrize("stream", [True, False])
async def test_answers_say_where_the_time_to_the_first_byte_went(gateway, http, stream):
    """Server-Timing: the gateway's part (admission, then the queue up to dispatch) and
    the deployment's (dispatch to first byte), so a caller can tell the waits apart."""
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 3, "stream": stream}
    headers = {"Authorization": f"Bearer {ALICE}"}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        timing = resp.headers["server-timing"]
        await resp.read()
    found = dict(re.findall(r"(\w+);dur=([0-9.]+)", timing))
    assert set(found) == {"admission", "queue", "upstream"}
    assert all(0 <= float(ms) < 5000 for ms in found.values())


async def test_an_error_says_where_its_time_went_too(gateway, http):
    """Refused before its lane is known: the whole time was admission."""
    body = {"model": "gpt-nothing", "messages": MESSAGES}
    headers = {"Authorization": f"Bearer {ALICE}"}
    async with http.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 404
        timing = resp.headers["server-timing"]
    found = dict(re.findall(r"(\w+);dur=([0-9.]+)", timing))
    assert set(found) == {"admission"}


async def test_refusals_never_reach_the_model(gateway, sim, http, alice, bob):
    before = (await sim_stats(http, sim))["received"]
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key="sk-wrong", max_retries=0
        ).chat.completions.create(model="chat", messages=MESSAGES)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await bob.chat.completions.create(model="private", messages=MESSAGES)
    assert denied.value.code == "model_not_allowed"
    with pytest.raises(openai.NotFoundError) as missing:
        await alice.chat.completions.create(model="gpt-nothing", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        await alice.chat.completions.create(model="chat", messages="hello")  # type: ignore[arg-type]
    assert (await sim_stats(http, sim))["received"] == before


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({}, b"{}", 401, "invalid_api_key"),
        ({"Authorization": "Basic abc"}, b"{}", 401, "invalid_api_key"),
        ({"Authorization": f"Bearer {ALICE}"}, b"{bad json", 400, "invalid_json"),
        (
            {"Authorization": f"Bearer {ALICE}"},
            b'{"model": "chat", "messages": [], "stream": 1}',
            400,
            "invalid_request",
        ),
        ({"Authorization": f"Bearer {ALICE}"}, b"x" * (MAX_BODY + 1), 413, "body_too_large"),
    ],
)
async def test_bad_input_gets_openai_shaped_errors(gateway, http, headers, body, status, code):
    url = f"{gateway.url}/v1/chat/completions"
    async with http.post(url, data=body, headers=headers) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
    assert error["code"] == code
    assert error["message"]
    assert error["type"]


async def test_unknown_route_and_method(gateway, http):
    async with http.get(f"{gateway.url}/v1/nothing") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "unknown_route"
    async with http.get(f"{gateway.url}/v1/chat/completions") as resp:
        assert resp.status == 405


async def test_wrong_upstream_key_is_the_gateways_problem_not_the_callers(alice):
    with pytest.raises(openai.InternalServerError) as info:
        await alice.chat.completions.create(model="miswired", messages=MESSAGES, max_tokens=2)
    assert info.value.status_code == 502
    assert info.value.code == "upstream_misconfigured"


async def test_health_ready_and_metrics(gateway, http, alice):
    await alice.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=2)
    stream = await alice.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=2, stream=True
    )
    _ = [c async for c in stream]
    for path in ("/health", "/ready"):
        async with http.get(gateway.url + path) as resp:
            assert resp.status == 200
    async with http.get(f"{gateway.url}/metrics") as resp:
        text = await resp.text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    ok = ("route", "chat"), ("model", "chat"), ("status_class", "2xx")
    assert samples[("sluicegate_requests_total", tuple(sorted(ok)))] >= 2
    ttft = [
        value
        for (name, labels), value in samples.items()
        if name == "sluicegate_time_to_first_token_seconds_count"
        and {("model", "chat"), ("route", "chat")} <= set(labels)
    ]
    assert sum(ttft) >= 1
    assert samples[("sluicegate_requests_in_flight", (("route", "chat"),))] == 0
    labels = {k for (_, pairs) in samples for k, _ in pairs}
    assert labels <= {
        "route",
        "model",
        "status_class",
        "status",
        "reason",
        "pool",
        "stage",
        "lane",
        "share",
        "tenant",
        "state",
        "deployment",
        "code",
        "outcome",
        "kind",
        "le",
        "implementation",
        "major",
        "minor",
        "patchlevel",
        "version",
    }


async def test_a_gateway_without_jobs_keeps_none_and_writes_no_database(sim, tmp_path):
    """No `jobs:` section: the job, file and batch routes say so, and nothing is written
    to the directory the gateway runs in."""
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(gateway_config(sim.url)))
    env = {"SIM_KEY": SIM_KEY, "BAD_KEY": "x", "ALICE_KEY": ALICE}
    proc = start("serve", ["--config", str(config)], tmp_path, env=env, cwd=home)
    try:
        client = openai.AsyncOpenAI(base_url=f"{proc.url}/v1", api_key=ALICE, max_retries=0)
        answer = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert answer.choices
        with pytest.raises(openai.NotFoundError) as missing:
            await client.files.create(file=("in.jsonl", b"{}\n"), purpose="batch")
        assert missing.value.code == "jobs_not_configured"
    finally:
        proc.stop()
    assert list(home.iterdir()) == []
