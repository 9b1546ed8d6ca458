"""`serve` raises its open-files limit to fit the connections it may hold, or says at
start that it cannot: a gateway allowed 4,096 connections and 1,024 files refuses
clients with `EMFILE` long before its own limit."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import yaml

from tests.support.processes import Proc, start

UNLIMITED = resource.RLIM_INFINITY


def config(folder: Path, max_connections: int) -> Path:
    path = folder / "gateway.yaml"
    deployment = {"name": "d", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    raw = {
        "server": {"max_connections": max_connections},
        "models": [{"name": "chat", "deployments": [deployment]}],
        "tenants": [{"name": "a", "keys": [{"env": "A_KEY"}]}],
    }
    path.write_text(yaml.safe_dump(raw))
    return path


@contextmanager
def started_with_few_files(folder: Path, max_connections: int) -> Iterator[Proc]:
    """The gateway, started with a soft open-files limit of 256 (it inherits ours)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        args = ["--config", str(config(folder, max_connections))]
        proc = start("serve", args, folder, env={"A_KEY": "sk-a"})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield proc
    finally:
        proc.stop()


def files_limit(proc: Proc) -> tuple[int, int]:
    return psutil.Process(proc.popen.pid).rlimit(psutil.RLIMIT_NOFILE)


def test_serve_raises_its_open_files_limit_to_fit_its_connections(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with started_with_few_files(tmp_path, 2000) as gateway:
        soft, _ = files_limit(gateway)
        assert soft == UNLIMITED or soft >= min(2000, hard)
        assert "open-files limit" not in gateway.output()


def test_serve_says_at_start_when_its_connections_cannot_fit(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    beyond = 2**31 - 1 if hard == UNLIMITED else hard + 1
    with started_with_few_files(tmp_path, beyond) as gateway:
        soft, _ = files_limit(gateway)
        assert soft == UNLIMITED or soft > 256
        assert "open-files limit" in gateway.output()
        assert "server.max_connections" in gateway.output()
