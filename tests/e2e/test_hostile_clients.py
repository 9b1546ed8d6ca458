"""Clients that misbehave on the wire, as raw sockets: none may pin capacity or a file
descriptor. A simulator without latency streams long answers quickly."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import orjson
import pytest

from sluicegate.core import keys
from tests.support.inprocess import InProcessGateway, inprocess_gateway
from tests.support.processes import Proc, start

ENV = {"A_KEY": "sk-a", "B_KEY": "sk-b"}
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def fast_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start(
        "sim",
        [
            "--model",
            "sim-model",
            "--time-scale",
            "0",
            "--max-model-len",
            "200000",
            "--kv-cache-tokens",
            "400000",
        ],
        tmp_path_factory.mktemp("sim"),
    )
    yield proc
    proc.stop()


def config(sim_url: str) -> dict:
    return {
        "server": {
            "header_timeout_s": 1,
            "body_timeout_s": 1,
            "write_timeout_s": 1,
            "max_connections": 40,
            "max_headers": 30,
            "max_header_bytes": 4096,
        },
        "routes": {"chat": {"max_concurrency": 1, "retry": {"max_attempts": 1}}},
        "pools": [{"name": "sim", "max_concurrency": 4}],
        "models": [
            {
                "name": "chat",
                "deployments": [
                    {
                        "name": "sim",
                        "base_url": f"{sim_url}/v1",
                        "model": "sim-model",
                        "pools": ["sim"],
                        "breaker": {"consecutive_failures": 1},
                    }
                ],
            }
        ],
        "tenants": [
            {"name": "a", "keys": [{"env": "A_KEY"}], "limits": {"max_concurrency": 1}},
            {"name": "b", "keys": [{"env": "B_KEY"}]},
        ],
    }


@pytest.fixture
async def gateway(fast_sim: Proc) -> AsyncIterator[InProcessGateway]:
    async with inprocess_gateway(config(fast_sim.url), ENV) as gw:
        yield gw


def request(body: dict, key: str = "sk-a", **headers: str) -> bytes:
    return post("/v1/chat/completions", orjson.dumps(body), key, **headers)


def post(
    path: str, raw: bytes, key: str = "sk-a", content_type: str = "application/json", **headers: str
) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "host: gw",
        f"authorization: Bearer {key}",
        f"content-type: {content_type}",
        f"content-length: {len(raw)}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + raw


async def connect(gw: InProcessGateway, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    port = int(gw.url.rsplit(":", 1)[1])
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def answer(sock: socket.socket, within_s: float = 10) -> bytes:
    """Everything the gateway sends until it closes the connection."""
    loop, chunks = asyncio.get_running_loop(), []
    async with asyncio.timeout(within_s):
        while chunk := await loop.sock_recv(sock, 65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def status_of(gw: InProcessGateway, raw: bytes) -> bytes:
    sock = await connect(gw)
    try:
        await asyncio.get_running_loop().sock_sendall(sock, raw)
        head = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 65536), 10)
        return head.split(b"\r\n", 1)[0]
    finally:
        sock.close()


async def counters(gw: InProcessGateway) -> dict[str, int]:
    """Everything a request holds while it runs."""
    runtime = gw.runtime
    pool = runtime.pools["sim"]
    store = pool.leases.store
    target = runtime.dispatchers["chat"].targets[0]
    return {
        "pool active": pool.counters.active,
        "pool slots": await store.in_use(pool.slot.key),
        "tenant a slots": await store.in_use(keys.tenant_slots("a")),
        "route slots": await store.in_use(keys.route_slots("chat")),
        "breaker in flight": target.breaker.in_flight,
        "leases held": pool.leases.held,
    }


async def settled(gw: InProcessGateway) -> dict[str, int]:
    """The counters once they are all zero, or after 5 s."""
    found: dict[str, int] = {}
    for _ in range(50):
        found = await counters(gw)
        if not any(found.values()):
            break
        await asyncio.sleep(0.1)
    return found


async def test_a_connection_that_sends_nothing_is_closed_with_a_408(gateway):
    sock = await connect(gateway)
    started = time.monotonic()
    reply = await answer(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"header_timeout" in reply
    assert 0.9 < time.monotonic() - started < 5


async def test_headers_trickled_a_byte_at_a_time_are_cut_off(gateway):
    sock = await connect(gateway)
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    sent = 0
    try:
        for byte in request(CHAT):
            await loop.sock_sendall(sock, bytes([byte]))
            sent += 1
            await asyncio.sleep(0.2)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < 25
    assert time.monotonic() - started < 6


async def test_too_many_or_too_large_headers_are_431(gateway):
    many = {f"x-h{i}": "1" for i in range(40)}
    assert (
        await status_of(gateway, request(CHAT, **many))
        == b"HTTP/1.1 431 Request Header Fields Too Large"
    )
    large = {"x-big": "a" * 5000}
    assert (
        await status_of(gateway, request(CHAT, **large))
        == b"HTTP/1.1 431 Request Header Fields Too Large"
    )
    assert await status_of(gateway, request(CHAT)) == b"HTTP/1.1 200 OK"


async def test_connections_past_the_limit_are_refused_at_once(gateway):
    held = [await connect(gateway) for _ in range(40)]
    try:
        extra = await connect(gateway)
        reply = await answer(extra, within_s=2)
        assert reply.startswith(b"HTTP/1.1 503"), reply
        assert b"too_many_connections" in reply
    finally:
        for sock in held:
            sock.close()


async def test_a_trickled_body_holds_only_its_tenants_slot_then_gets_a_408(gateway):
    """The route admits one request at a time; tenant a sends half a body and stalls,
    and tenant b is still served."""
    slow = await connect(gateway)
    raw = request(CHAT)
    await asyncio.get_running_loop().sock_sendall(slow, raw[: len(raw) - 10])
    await asyncio.sleep(0.3)
    assert await status_of(gateway, request(CHAT, key="sk-b")) == b"HTTP/1.1 200 OK"
    reply = await answer(slow)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"body_timeout" in reply
    assert not any((await settled(gateway)).values()), await counters(gateway)


async def test_a_stream_nobody_reads_lets_go_of_everything_it_held(gateway, caplog):
    """A long stream to a socket that never reads: within the write timeout the
    connection is aborted, its slots and permits come back, and the deployment's breaker
    (one failure opens it) learned nothing: the same tenant is served next."""
    uvicorn_log = logging.getLogger("uvicorn.error")  # it does not propagate to the root
    uvicorn_log.addHandler(caplog.handler)
    body = {**CHAT, "stream": True, "max_tokens": 150_000}
    stuck = await connect(gateway, receive_buffer=4096)
    await asyncio.get_running_loop().sock_sendall(stuck, request(body))
    await asyncio.sleep(4)
    assert not any((await settled(gateway)).values()), await counters(gateway)
    assert await status_of(gateway, request(CHAT)) == b"HTTP/1.1 200 OK"
    stuck.close()
    uvicorn_log.removeHandler(caplog.handler)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_compressed_body_is_refused(gateway):
    raw = request(CHAT, **{"content-encoding": "gzip"})
    assert (await status_of(gateway, raw)).startswith(b"HTTP/1.1 415")


async def test_a_send_never_waits_past_the_requests_deadline(fast_sim):
    """With a write timeout far away, the request's own 2 s deadline still ends it."""
    raw = config(fast_sim.url)
    raw["server"]["write_timeout_s"] = 120
    async with inprocess_gateway(raw, ENV) as gw:
        body = {**CHAT, "stream": True, "max_tokens": 150_000}
        stuck = await connect(gw, receive_buffer=4096)
        sent = request(body, **{"x-sluicegate-timeout": "2"})
        await asyncio.get_running_loop().sock_sendall(stuck, sent)
        await asyncio.sleep(5)
        assert not any((await settled(gw)).values()), await counters(gw)
        stuck.close()


JOB = orjson.dumps({"endpoint": "/v1/chat/completions", "body": CHAT})
UPLOAD = (
    b'--xyz\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    b'--xyz\r\ncontent-disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
    + b"{}" * 4096
    + b"\r\n--xyz--\r\n"
)
TRICKLED = {
    "/v1/jobs": post("/v1/jobs", JOB),
    "/v1/batches": post("/v1/batches", orjson.dumps({"input_file_id": "file-x"})),
    "/v1/files": post("/v1/files", UPLOAD, content_type="multipart/form-data; boundary=xyz"),
}


@pytest.fixture
async def job_routes(fast_sim: Proc, tmp_path) -> AsyncIterator[InProcessGateway]:
    raw = config(fast_sim.url)
    raw["jobs"] = {"sqlite_path": str(tmp_path / "jobs.db"), "tenant_max_concurrency": 2}
    async with inprocess_gateway(raw, ENV) as gw:
        yield gw


@pytest.fixture
def stalled(job_routes: InProcessGateway) -> Iterator[Callable[[bytes], Awaitable[socket.socket]]]:
    """Opens connections that send all of a request but its last 10 bytes; they are
    closed before the gateway stops, which would otherwise wait for them."""
    opened: list[socket.socket] = []

    async def open_one(raw: bytes) -> socket.socket:
        sock = await connect(job_routes)
        opened.append(sock)
        await asyncio.get_running_loop().sock_sendall(sock, raw[:-10])
        return sock

    yield open_one
    for sock in opened:
        sock.close()


@pytest.mark.parametrize("path", TRICKLED)
async def test_a_stalled_job_file_or_batch_body_gets_a_408_and_is_closed(stalled, path):
    started = time.monotonic()
    reply = await answer(await stalled(TRICKLED[path]))
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"body_timeout" in reply
    assert 0.9 < time.monotonic() - started < 5


async def test_stalled_uploads_hold_only_their_tenants_share_of_the_job_routes(job_routes, stalled):
    held = [await stalled(TRICKLED["/v1/files"]) for _ in range(2)]
    await asyncio.sleep(0.3)
    reply = await answer(await stalled(TRICKLED["/v1/files"]), within_s=2)
    assert reply.startswith(b"HTTP/1.1 429"), reply
    assert b"tenant_concurrency_limited" in reply
    assert await status_of(job_routes, post("/v1/jobs", JOB, key="sk-b")) == (
        b"HTTP/1.1 202 Accepted"
    )
    for sock in held:
        assert (await answer(sock)).startswith(b"HTTP/1.1 408")
    assert await status_of(job_routes, post("/v1/jobs", JOB)) == b"HTTP/1.1 202 Accepted"
