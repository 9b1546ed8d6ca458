"""Instructions the gateway process spends per HTTP request (callgrind), start-up excluded.

Starts a zero-latency `sluicegate sim` natively and `sluicegate serve` under
`valgrind --tool=callgrind --instr-atstart=no`, warms up, switches instrumentation on
with callgrind_control, sends N requests one at a time on one keep-alive connection,
switches it off and stops the gateway. Two values of N, subtracted, cancel what is
not per request. Loopback only; every process is stopped at the end.

Compare two versions by pointing SRC at each one's `src` folder, e.g. a worktree of a
commit in /tmp/start and this checkout (see docs/benchmarks.md):

    .venv/bin/python bench/gateway_instructions.py /tmp/start/src plain 200 1000
    .venv/bin/python bench/gateway_instructions.py src plain 200 1000

usage: gateway_instructions.py SRC MODE N1 N2   (MODE: plain | stream)
SIM_TIME_SCALE=1 paces the simulator (events arrive apart, as from a real deployment;
default 0: no latency, a short answer arrives in one or two reads). SPEND=1 prices the
deployment and gives the tenant a budget (in memory): the cost of spend accounting.
CONFIG_FILE=PATH serves that config instead (bench/overhead/*.yaml: a feature configured
as its docs page shows). FLOOR=edge or FLOOR=proxy runs bench/floor_app.py in place of
the gateway: the same server with no rules behind it, answering at once or relaying
through aiohttp.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PY = sys.executable
KEY = "sk-cg-bench"
CONFIG = """\
server: {max_body_bytes: 4194304}
models:
  - name: bench-chat
    deployments:
      - name: sim
        provider: openai
        base_url: ${SLUICEGATE_SIM_URL}/v1
        model: sim-model
        max_connections: 256
tenants:
  - name: bench
    keys: [{env: SLUICEGATE_BENCH_KEY}]
"""
if os.environ.get("CONFIG_FILE"):
    with open(os.environ["CONFIG_FILE"]) as config_file:
        CONFIG = config_file.read()
elif os.environ.get("SPEND") == "1":
    CONFIG = (
        CONFIG.replace(
            "        max_connections: 256\n",
            "        max_connections: 256\n        price: {input: 1.0, output: 2.0}\n",
        )
        + "spend: {budgets: [{tenant: bench, amount: 1000000}]}\n"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"not ready: {url}")


def body(stream: bool) -> bytes:
    return json.dumps(
        {
            "model": "bench-chat",
            "messages": [{"role": "user", "content": "x" * 400}],
            "max_tokens": 16,
            "stream": stream,
        }
    ).encode()


def send(conn: http.client.HTTPConnection, payload: bytes) -> None:
    conn.request(
        "POST",
        "/v1/chat/completions",
        payload,
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status


def served(config: str, port: int) -> list[str]:
    """The gateway's command line after the interpreter, or the floor's (FLOOR)."""
    floor = os.environ.get("FLOOR")
    if floor:
        return [os.path.join(os.path.dirname(__file__), "floor_app.py"), floor, str(port)]
    args = ["--config", config, "--host", "127.0.0.1", "--port", str(port)]
    return ["-m", "sluicegate", "serve", *args, "--log-level", "warning"]


def instrument(pid: int, state: str) -> None:
    """Switch callgrind's instrumentation of process `pid` on or off."""
    subprocess.run(["callgrind_control", "-i", state, str(pid)], check=True, capture_output=True)


def collected(src: str, stream: bool, n: int, sim_url: str, work: str) -> int:
    port = free_port()
    config = os.path.join(work, "gateway.yaml")
    with open(config, "w") as f:
        f.write(CONFIG)
    env = {
        **os.environ,
        "PYTHONPATH": os.path.abspath(src),
        "SLUICEGATE_BENCH_KEY": KEY,
        "SLUICEGATE_SIM_URL": sim_url,
    }
    log = open(os.path.join(work, f"valgrind-{n}.log"), "w+")  # noqa: SIM115 - read after exit
    gateway = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--callgrind-out-file=/dev/null",
            PY,
            *served(config, port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/ready", 300)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        payload = body(stream)
        for _ in range(100):
            send(conn, payload)
        instrument(gateway.pid, "on")
        for _ in range(n):
            send(conn, payload)
        instrument(gateway.pid, "off")
        conn.close()
    finally:
        gateway.send_signal(signal.SIGINT)
        gateway.wait(120)
    log.seek(0)
    found = re.search(r"Collected : (\d+)", log.read())
    log.close()
    if found is None:
        raise SystemExit(f"no instruction count in {log.name}")
    return int(found.group(1))


def main() -> None:
    src, mode, n1, n2 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with tempfile.TemporaryDirectory(prefix="cg-http-") as work:
        sim_port = free_port()
        sim = subprocess.Popen(
            [
                PY,
                "-m",
                "sluicegate",
                "sim",
                "--time-scale",
                os.environ.get("SIM_TIME_SCALE", "0"),
                "--host",
                "127.0.0.1",
                "--port",
                str(sim_port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            sim_url = f"http://127.0.0.1:{sim_port}"
            wait_ready(sim_url + "/health", 60)
            a = collected(src, mode == "stream", n1, sim_url, work)
            b = collected(src, mode == "stream", n2, sim_url, work)
        finally:
            sim.send_signal(signal.SIGINT)
            sim.wait(30)
    print(f"{src} {mode}: {a} ({n1} requests), {b} ({n2}); per request {(b - a) / (n2 - n1):,.0f}")


if __name__ == "__main__":
    main()
