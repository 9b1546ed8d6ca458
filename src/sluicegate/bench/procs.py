"""The benchmark's own simulator and gateway: child processes on loopback, always stopped."""

from __future__ import annotations

import math
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil

from sluicegate.children import spawn, stop

HOST = "127.0.0.1"
GATEWAY_MODEL = "bench-chat"
SIM_MODEL = "sim-model"
KEY_ENV = "SLUICEGATE_BENCH_KEY"
SIM_URL_ENV = "SLUICEGATE_SIM_URL"
"""Set in the gateway's environment to the simulator's URL, for `${SLUICEGATE_SIM_URL}`."""
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
_POLL_S = 0.05
_LOG_TAIL_LINES = 30

_GATEWAY_CONFIG = """\
server: {{max_body_bytes: 4194304}}
models:
  - name: {model}
    deployments:
      - name: sim
        provider: openai
        base_url: ${{{sim_url_env}}}/v1
        model: {sim_model}
        max_connections: 256
tenants:
  - name: bench
    keys: [{{env: {key_env}}}]
{limits}"""
_TENANT_LIMITS = "    limits: {limits}\n"
"""The bench tenant's `limits` (docs/configuration.md), as a JSON flow mapping, which YAML
reads as is."""


def redis_store(url: str) -> str:
    """Top-level YAML keeping the gateway's state in Redis under a key prefix of the
    run's own, for layouts of several workers (`serve --workers N`)."""
    prefix = f"sluicegate-bench-{secrets.token_hex(4)}:"
    return f"store: redis\nredis: {{url: {url!r}, key_prefix: {prefix!r}}}\n"


class ServiceError(RuntimeError):
    """A child process did not start or went away; the message carries its log's tail."""


@dataclass(frozen=True, slots=True)
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise ServiceError(f"{self.name} exited with {self.popen.returncode}\n{self.tail()}")

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        return "\n".join(f"  {self.name}| {line}" for line in lines)


@dataclass(frozen=True, slots=True)
class Services:
    sim: Child
    gateway: Child
    key: str


class ProcessMeter:
    """The gateway's own accounting (psutil): user+system CPU and resident memory, of
    the process and (for `serve --workers N`) every worker it started."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)

    def _tree(self) -> list[psutil.Process]:
        return [self._process, *self._process.children(recursive=True)]

    def cpu_s(self) -> float:
        try:
            times = [process.cpu_times() for process in self._tree()]
        except psutil.Error as exc:
            raise ServiceError(f"cannot read the gateway's CPU time: {exc}") from exc
        return sum(t.user + t.system for t in times)

    def rss_bytes(self) -> int:
        try:
            return sum(int(process.memory_info().rss) for process in self._tree())
        except psutil.Error as exc:
            raise ServiceError(f"cannot read the gateway's memory: {exc}") from exc


@contextmanager
def services(
    tenant_limits: Mapping[str, float] | None = None,
    *,
    extra_config: str = "",
    serve_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Services]:
    """Start the zero-latency simulator, then a gateway in front of it; stop both after.

    `tenant_limits` are the bench tenant's `limits`, for scenarios that need refusals;
    `extra_config` (top-level YAML), `serve_args` and `extra_env` change the gateway itself.
    """
    limits = ""
    if tenant_limits:
        limits = _TENANT_LIMITS.format(limits=orjson.dumps(dict(tenant_limits)).decode())
    key = f"sk-bench-{secrets.token_urlsafe(16)}"
    config = _GATEWAY_CONFIG.format(
        model=GATEWAY_MODEL,
        sim_url_env=SIM_URL_ENV,
        sim_model=SIM_MODEL,
        key_env=KEY_ENV,
        limits=limits,
    )
    config += extra_config
    env = {**(extra_env or {}), KEY_ENV: key}
    with stack(["--time-scale", "0"], config, env, serve_args=serve_args) as (
        sim,
        gateway,
    ):
        yield Services(sim, gateway, key)


@contextmanager
def stack(
    sim_args: Sequence[str],
    gateway_config: str,
    env: Mapping[str, str],
    keep_logs: Path | None = None,
    serve_args: Sequence[str] = (),
) -> Iterator[tuple[Child, Child]]:
    """Start `sluicegate sim SIM_ARGS`, then a gateway with this config text; stop both after.

    The gateway's environment is `env` plus SLUICEGATE_SIM_URL, which the config may use.
    With `keep_logs`, both processes' logs are copied there once they stopped.
    """
    with tempfile.TemporaryDirectory(prefix="sluicegate-bench-") as logs:
        log_dir = Path(logs)
        config = log_dir / "gateway.yaml"
        config.write_text(gateway_config)
        serve = ["serve", "--config", str(config), "--log-level", "warning", *serve_args]
        try:
            with service("sim", ["sim", *sim_args], "/health", log_dir) as sim:
                gateway_env = {**env, SIM_URL_ENV: sim.url}
                with service("gateway", serve, "/ready", log_dir, gateway_env) as gateway:
                    yield sim, gateway
        finally:
            if keep_logs is not None:
                keep_logs.mkdir(parents=True, exist_ok=True)
                for log in log_dir.glob("*.log"):
                    shutil.copy(log, keep_logs / log.name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@contextmanager
def service(
    name: str,
    args: Sequence[str],
    ready_path: str,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
) -> Iterator[Child]:
    """Run `python -m sluicegate ARGS` on a free port, logging to a file, until ready."""
    port = free_port()
    log = log_dir / f"{name}.log"
    command = [sys.executable, "-m", "sluicegate", *args, "--host", HOST, "--port", str(port)]
    with log.open("wb") as out:
        popen = spawn(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        child = Child(name, popen, f"http://{HOST}:{port}", log)
        try:
            _await_ready(child, child.url + ready_path)
            yield child
        finally:
            stop(popen, STOP_GRACE_S)


def _await_ready(child: Child, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    for _ in range(math.ceil(READY_TIMEOUT_S / _POLL_S)):
        child.check_alive()
        if _answers(url):
            return
        if time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    raise ServiceError(f"{child.name} not ready after {READY_TIMEOUT_S:g} s\n{child.tail()}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False
