"""Operating the gateway, through real processes: a request followed by its id (the
answer's header and error body, the upstream, the access log, the operator log, the job
record), an access log without prompts or keys, and a stop that cuts an open stream with
an error event and no traceback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.jobs import CHAT, KEYS, JobClient, chat, gateway_config, start_sim
from tests.support.jobs import start_gateway as start_with_jobs
from tests.support.processes import Proc, free_port

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SECRET = "a-prompt-only-the-model-may-read"
ALICE = {"Authorization": f"Bearer {KEYS['alice']}"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("operations")


@pytest.fixture(scope="module")
def upstream(folder: Path) -> Iterator[Proc]:
    proc = start_sim(folder)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gateway(upstream: Proc, folder: Path) -> Iterator[Proc]:
    logs = {"access": "on", "access_path": str(folder / "access.log")}
    config = gateway_config(upstream, {"sqlite_path": str(folder / "jobs.db")}, logs=logs)
    proc = start_with_jobs(folder, config)
    yield proc
    proc.stop()


async def access_line(folder: Path, request_id: str) -> dict:
    """The access log's line for `request_id`, once the writer has written it."""
    path = folder / "access.log"
    async with asyncio.timeout(5):
        while True:
            if path.exists():
                for line in path.read_text().splitlines():
                    fields = json.loads(line)
                    if fields["request_id"] == request_id:
                        return fields
            await asyncio.sleep(0.05)


async def heard(http: aiohttp.ClientSession, upstream: Proc, request_id: str) -> dict:
    """What the upstream heard of `request_id`'s one attempt: the id with a suffix of the
    attempt's own."""
    async with http.get(f"{upstream.url}/sim/heard") as resp:
        found = [h for h in await resp.json() if h["x-request-id"].startswith(f"{request_id}-")]
    assert len(found) == 1, found
    assert re.fullmatch(r"[0-9a-f]{8}", found[0]["x-request-id"].removeprefix(f"{request_id}-"))
    return found[0]


async def test_a_request_is_followed_by_its_id_everywhere(http, gateway, upstream, folder):
    rid = f"e2e-{uuid.uuid4()}"
    headers = {**ALICE, "x-request-id": rid, "traceparent": PARENT}
    async with http.post(f"{gateway.url}{CHAT}", json=chat(), headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["x-request-id"] == rid
    told = await heard(http, upstream, rid)
    assert (told["traceparent"], told["tracestate"]) == (PARENT, None)
    line = await access_line(folder, rid)
    assert (line["status"], line["tenant"], line["deployments"]) == (200, "alice", ["sim-chat"])

    headers = {**ALICE, "x-request-id": "not a safe id"}
    async with http.post(f"{gateway.url}{CHAT}", json=chat(model="nope"), headers=headers) as resp:
        assert resp.status == 404
        made = resp.headers["x-request-id"]
        assert (await resp.json())["error"]["request_id"] == made != "not a safe id"
    assert (await access_line(folder, made))["code"] == "model_not_found"


async def test_a_refusal_is_logged_under_its_request_id(http, gateway):
    rid = f"refused-{uuid.uuid4()}"
    headers = {**ALICE, "x-request-id": rid, "x-sluicegate-timeout": "0.001"}
    async with http.post(f"{gateway.url}{CHAT}", json=chat(), headers=headers) as resp:
        assert resp.status == 504
    async with asyncio.timeout(5):
        while f"request_id={rid}" not in gateway.output():  # noqa: ASYNC110 - a file, no event
            await asyncio.sleep(0.05)
    (line,) = [line for line in gateway.output().splitlines() if rid in line]
    assert " WARNING worker=0 " in line
    assert "refused on chat with 504 deadline_exceeded" in line


async def test_the_access_log_holds_no_prompt_and_no_key(http, gateway, folder):
    rid = f"secret-{uuid.uuid4()}"
    body = chat(messages=[{"role": "user", "content": SECRET}])
    headers = {**ALICE, "x-request-id": rid}
    async with http.post(f"{gateway.url}{CHAT}", json=body, headers=headers) as resp:
        assert resp.status == 200
        answer = (await resp.json())["choices"][0]["message"]["content"]
    await access_line(folder, rid)
    text = (folder / "access.log").read_text()
    assert SECRET not in text
    assert KEYS["alice"] not in text
    assert answer not in text


async def test_a_job_runs_under_the_id_of_the_request_that_submitted_it(http, gateway, upstream):
    rid = f"job-{uuid.uuid4()}"
    jobs = JobClient(http, gateway, "alice")
    status, headers, doc = await jobs.submit(headers={"x-request-id": rid})
    returned = {name.lower(): value for name, value in headers.items()}["x-request-id"]
    assert (status, returned, doc["request_id"]) == (202, rid, rid)
    assert (await jobs.final([doc["id"]]))[doc["id"]]["status"] == "succeeded"
    await heard(http, upstream, rid)


async def test_a_stream_open_at_the_stop_ends_with_an_error_event_and_no_traceback(
    http, upstream, tmp_path
):
    config = gateway_config(upstream, {"sqlite_path": str(tmp_path / "jobs.db")})
    config["server"] = {"stop_grace_s": 0.5}
    proc = start_with_jobs(tmp_path, config)
    try:
        body = chat(max_tokens=5000, stream=True)
        headers = {**ALICE, "x-request-id": "cut-me"}
        async with http.post(f"{proc.url}{CHAT}", json=body, headers=headers) as resp:
            assert resp.status == 200
            await resp.content.readline()
            stopped = time.monotonic()
            proc.popen.send_signal(signal.SIGTERM)
            events = [line async for line in resp.content if line.startswith(b"data: ")]
        took_s = time.monotonic() - stopped
        error = json.loads(events[-1].removeprefix(b"data: "))["error"]
        assert (error["code"], error["request_id"]) == ("server_shutting_down", "cut-me")
        assert 0.4 < took_s < 4
        assert await asyncio.to_thread(proc.popen.wait, 10) == 0
    finally:
        proc.stop()
    output = proc.output()
    assert "Traceback" not in output
    assert "CancelledError" not in output
    (cut,) = [line for line in output.splitlines() if "cut an open stream" in line]
    assert "request_id=cut-me" in cut


async def test_metrics_on_an_address_of_their_own_behind_a_token(http, upstream, tmp_path):
    port = free_port()
    token = "scrape-me"
    config = gateway_config(upstream, {"sqlite_path": str(tmp_path / "jobs.db")})
    digest = hashlib.sha256(token.encode()).hexdigest()
    config["metrics"] = {"host": "127.0.0.1", "port": port, "keys": [{"sha256": digest}]}
    proc = start_with_jobs(tmp_path, config)
    try:
        async with http.get(f"{proc.url}/metrics") as resp:
            assert resp.status == 404
        apart_url = f"http://127.0.0.1:{port}/metrics"
        async with http.get(apart_url) as resp:
            assert resp.status == 401
        async with http.get(apart_url, headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200
            assert "sluicegate_requests_in_flight" in await resp.text()
        async with http.get(f"http://127.0.0.1:{port}/v1/models", headers=ALICE) as resp:
            assert resp.status == 404
    finally:
        proc.stop()
