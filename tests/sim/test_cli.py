"""Starting the simulator: flags, the YAML file, API keys and clean refusals of bad values."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sluicegate.sim import cli
from sluicegate.sim.options import load_options
from tests.sim.conftest import StartSim
from tests.support.processes import Proc, start


def refuse(*args: str, code: int = 2) -> str:
    """Run the simulator with bad settings; return its single line of complaint."""
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate.sim", "--host", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == code, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_bad_flag_values_stop_with_one_line_naming_the_field() -> None:
    assert "max_num_seqs must be an integer, not 'lots'" in refuse("--max-num-seqs", "lots")
    assert "error_rate must be between 0 and 1" in refuse("--error-rate", "2")


def test_a_taken_port_stops_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert f"cannot listen on 127.0.0.1:{port}" in refuse("--port", port, code=1)


def test_bad_config_files_stop_with_one_line(tmp_path: Path) -> None:
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("max_num_seqs: 4\nturbo: true\n")
    assert "unknown option 'turbo'" in refuse("--config", str(unknown))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("scheduling_policy: lottery\n")
    assert "scheduling_policy must be one of fcfs, priority" in refuse("--config", str(wrong))
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    assert "cannot read config" in refuse("--config", str(broken))
    assert "cannot read config" in refuse("--config", str(tmp_path / "missing.yaml"))


def test_flags_override_the_config_file_key_by_key(tmp_path: Path) -> None:
    config = tmp_path / "sim.yaml"
    config.write_text(
        "model: [a, b]\nmax_num_seqs: 3\nstep_base_ms: 4\nthrottle_retry_after: 1.5\nhang: true\n"
    )
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    cli.add_arguments(commands.add_parser("sim"))
    args = parser.parse_args(["sim", "--config", str(config), "--model", "c", "--no-hang"])
    options = load_options(vars(args), args.config)
    assert options.models == ("c",)
    assert options.engine.max_num_seqs == 3
    assert options.engine.step_base_s == pytest.approx(0.004)
    assert options.faults.throttle_retry_after_s == 1.5
    assert options.faults.hang is False
    assert options.port == 8001


async def test_api_key_and_config_file_in_a_running_sim(
    start_sim: StartSim, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = tmp_path / "sim.yaml"
    config.write_text("model: from-file\napi_key: sekret\ndown: true\n")
    sim = start_sim("--config", str(config), "--no-down")
    async with http.get(sim.url + "/v1/models") as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["type"] == "authentication_error"
    body = {"model": "from-file", "prompt": "hi", "max_tokens": 1}
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        assert resp.status == 401
    headers = {"Authorization": "Bearer sekret"}
    async with http.get(sim.url + "/v1/models", headers=headers) as resp:
        assert [model["id"] for model in (await resp.json())["data"]] == ["from-file"]
    async with http.post(sim.url + "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 200
    assert "listening on http://127.0.0.1:" in sim.output()


async def test_down_flag_starts_the_sim_unhealthy(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = start_sim("--down")
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 503


@pytest.fixture
def cli_sim(tmp_path: Path) -> Iterator[Proc]:
    proc = start("sim", ["--time-scale", "0", "--model", "via-cli"], tmp_path)
    yield proc
    proc.stop()
    assert proc.popen.returncode == 0, proc.output()


async def test_runs_as_the_sluicegate_sim_subcommand(
    cli_sim: Proc, http: aiohttp.ClientSession
) -> None:
    async with http.get(cli_sim.url + "/v1/models") as resp:
        assert [model["id"] for model in (await resp.json())["data"]] == ["via-cli"]
