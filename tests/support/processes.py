"""Start real `sluicegate` processes on loopback ports and wait until they answer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sluicegate.children import spawn, stop


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        stop(self.popen, grace_s=10)


def start(
    command: str,
    args: Sequence[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    ready_path: str = "/health",
    timeout_s: float = 20.0,
    cwd: Path | None = None,
) -> Proc:
    """Run `sluicegate COMMAND ARGS --port N` (in `cwd`, else this one) and wait until
    `ready_path` answers 200."""
    port = free_port()
    log = log_dir / f"{command}-{port}.log"
    handle = log.open("wb")
    popen = spawn(
        [
            sys.executable,
            "-m",
            "sluicegate",
            command,
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    proc = Proc(popen, port, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{command} exited with {popen.returncode}:\n{proc.output()}")
        try:
            with urllib.request.urlopen(proc.url + ready_path, timeout=1) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"{command} did not become ready in {timeout_s}s:\n{proc.output()}")
