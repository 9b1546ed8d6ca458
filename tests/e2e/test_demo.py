"""The demo as `make run` starts it (`sluicegate serve` with no config, its simulator a
child), under the noisy neighbour `make demo-load` sends, squeezed into 30 s as `bench run
--quick` squeezes a scenario (rates kept, the burst halved): the interactive lane keeps
its SLO while batch work waits in its own queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from sluicegate.bench import scenario as scenarios
from sluicegate.serve import DEMO_ADMIN_KEY
from tests.support.processes import Proc, start

DEMO_LOAD = Path(__file__).parents[2] / "src" / "sluicegate" / "demo-load.yaml"
DURATION_S = 30
DRAIN_S = 5
KEYS = {"SLUICEGATE_DEMO_KEY_ALICE": "sk-demo-alice", "SLUICEGATE_DEMO_KEY_BOB": "sk-demo-bob"}


def status(gateway: Proc) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{gateway.url}/admin/status", headers={"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())


def test_the_interactive_lane_keeps_its_slo_while_the_neighbours_batch_waits(tmp_path):
    gateway = start("serve", [], tmp_path, cwd=tmp_path, ready_path="/ready", timeout_s=30)
    assert f"Status page: {gateway.url}/status (admin key {DEMO_ADMIN_KEY})" in gateway.output()
    scenario = scenarios.compressed(scenarios.load(DEMO_LOAD), DURATION_S, DRAIN_S)
    path = tmp_path / "load.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    command = [sys.executable, "-m", "sluicegate", "bench", "run", str(path)]
    command += ["--target", f"{gateway.url}/v1", "--out", str(tmp_path / "out")]
    log = (tmp_path / "load.log").open("wb")
    load = subprocess.Popen(command, env={**os.environ, **KEYS}, stdout=log, stderr=log)
    batch_queued: list[int] = []
    try:
        started = time.monotonic()
        while load.poll() is None and time.monotonic() - started < DURATION_S + DRAIN_S + 30:
            elapsed = time.monotonic() - started
            lanes = status(gateway)["models"]["demo-chat"]["lanes"]
            if 5 <= elapsed <= DURATION_S:
                batch_queued.append(lanes["batch"]["queued"])
            time.sleep(1.0)
        assert load.wait(timeout=5) == 0, (tmp_path / "load.log").read_text()
        interactive = status(gateway)["slo"]["models"]["demo-chat"]["interactive"]
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
        gateway.stop()
    assert len(batch_queued) >= 15
    assert min(batch_queued) > 0, batch_queued
    assert interactive["accepted"] >= 60, interactive
    assert interactive["attainment"] >= 0.9, interactive
