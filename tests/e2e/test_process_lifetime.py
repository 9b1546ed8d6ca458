"""Processes the CLI starts end with their parent, however the parent is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.processes import start

GONE_WITHIN_S = 15.0


def children_of(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def assert_all_gone(processes: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=GONE_WITHIN_S)
    assert alive == [], [p.cmdline() for p in alive]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_the_demo_simulator_ends_with_the_gateway(tmp_path, sig):
    gateway = start("serve", [], tmp_path, cwd=tmp_path)
    try:
        children = children_of(gateway.popen.pid)
        assert any("sim" in child.cmdline() for child in children), children
        gateway.popen.send_signal(sig)
        code = gateway.popen.wait(timeout=GONE_WITHIN_S)
        assert_all_gone(children)
    finally:
        gateway.stop()
    if sig != signal.SIGKILL:
        assert code == 0, gateway.output()


PARENT = """
import sys, time
from sluicegate.children import spawn
child = spawn([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_spawned_child_ends_when_its_parent_is_killed():
    """The path every CLI child takes (demo simulator, bench gateway and simulator)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=dict(os.environ)
    )
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        time.sleep(0.1)
        assert child.is_running()
        parent.kill()
        parent.wait(timeout=GONE_WITHIN_S)
        assert_all_gone([child])
    finally:
        parent.kill()
        parent.wait()
