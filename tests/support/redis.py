"""The real Redis the shared-store tests use: the machine's own (reachable, or skipped
with the reason, except that CI=true makes its absence a failure), or a `redis-server`
a test starts for itself on a free port when it must stop or kill it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluicegate.config.loader import parse_settings
from sluicegate.core.types import RedisPolicy
from sluicegate.stores.redis import RedisLimitStore
from sluicegate.stores.resp import RespConnection
from tests.support.clock import FakeClock
from tests.support.processes import free_port

REDIS_URL = os.environ.get("SLUICEGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI=true requires it")
    pytest.skip(reason)


def test_prefix() -> str:
    """A key prefix of the test's own, so tests never see each other's keys."""
    return f"sluicegate-test:{uuid.uuid4().hex[:10]}:"


def redis_policy(url: str) -> RedisPolicy:
    """The shared store's settings of a config naming only its URL: every default."""
    raw = {
        "models": [
            {
                "name": "chat",
                "deployments": [{"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
            }
        ],
        "tenants": [{"name": "t", "keys": [{"env": "KEY"}]}],
        "store": "redis",
        "redis": {"url": url, "key_prefix": test_prefix()},
    }
    policy = parse_settings(raw, "test.yaml", {"KEY": "sk-t"}).redis
    assert policy is not None
    return policy


@asynccontextmanager
async def redis_or_skip(url: str = REDIS_URL) -> AsyncIterator[tuple[Redis, str]]:
    """A client and a fresh key prefix; every key under the prefix is deleted after."""
    client = Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        _unavailable(f"Redis is not reachable at {url} ({exc!r})")
    prefix = test_prefix()
    try:
        yield client, prefix
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()


async def delete_prefix(client: Redis, prefix: str) -> None:
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await client.delete(*keys)


class RedisServer:
    """A `redis-server` of the test's own on a free loopback port: it can be killed and
    started again on the same port."""

    def __init__(self, folder: Path, *, tls: bool = False, options: Sequence[str] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            _unavailable("redis-server is not installed")
        self._binary = str(binary)
        folder.mkdir(parents=True, exist_ok=True)
        self._folder = folder
        self.port = free_port()
        self._popen: subprocess.Popen[bytes] | None = None
        self._options = list(options)
        """More `redis-server` options (`--cluster-enabled yes`)."""
        self.certificate = _self_signed(folder) if tls else None
        """Served over TLS only, under this certificate (its own CA) for 127.0.0.1."""

    @property
    def url(self) -> str:
        if self.certificate is None:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.certificate}"

    def start(self) -> None:
        log = (self._folder / f"redis-{self.port}.log").open("ab")
        listen = ["--port", str(self.port)]
        if self.certificate is not None:
            cert, key = str(self.certificate), str(self.certificate.with_suffix(".key"))
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no",
                      "--tls-cert-file", cert, "--tls-key-file", key]  # fmt: skip
        self._popen = subprocess.Popen(
            [self._binary, *listen, "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self._folder), *self._options],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _pongs(self.port, self.certificate):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def pause(self) -> None:
        """Stop the server without closing anything (SIGSTOP): connections stay open and
        connecting still succeeds (the kernel accepts), but nothing is answered."""
        if self._popen is not None:
            self._popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._popen is not None:
            self._popen.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self._popen is not None:
            self._popen.kill()
            self._popen.wait(10)
            self._popen = None


def _pongs(port: int, certificate: Path | None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as plain:
            if certificate is None:
                return _ping(plain)
            context = ssl.create_default_context(cafile=str(certificate))
            with context.wrap_socket(plain, server_hostname="127.0.0.1") as sock:
                return _ping(sock)
    except OSError:
        return False


def _ping(sock: socket.socket) -> bool:
    sock.sendall(b"PING\r\n")
    return sock.recv(16).startswith(b"+PONG")


def _self_signed(folder: Path) -> Path:
    """A certificate for 127.0.0.1 that is its own CA, made by the openssl command."""
    if shutil.which("openssl") is None:
        _unavailable("openssl is not installed (needed for a TLS redis-server)")
    certificate = folder / "redis-tls.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(certificate.with_suffix(".key")), "-out", str(certificate)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return certificate


@contextmanager
def redis_server(
    folder: Path, *, tls: bool = False, options: Sequence[str] = ()
) -> Iterator[RedisServer]:
    server = RedisServer(folder, tls=tls, options=options)
    server.start()
    try:
        yield server
    finally:
        server.resume()
        server.kill()


@asynccontextmanager
async def store_on_clock() -> AsyncIterator[tuple[RedisLimitStore, FakeClock]]:
    """A Redis limit store under a fresh prefix whose scripts run on a test clock."""
    async with redis_or_skip() as (_, prefix):
        clock = FakeClock()
        store = RedisLimitStore(RespConnection(REDIS_URL, 5.0), prefix, 5.0, clock=clock)
        try:
            yield store, clock
        finally:
            await store.close()
