"""How many connections the gateway opens to its upstream over N requests (issue 56).

Starts a zero-latency `sluicegate sim` and `sluicegate serve` (the config of
`gateway_instructions.py`), sends N non-streaming then N streaming requests one at a time
on one keep-alive connection, and reads the kernel's socket table (`ss`) before and after
each series: the gateway's established connections to the simulator, and the TIME-WAIT
sockets on either side that every closed connection leaves for a minute. Reuse holds
when neither grows with N. Loopback only; every process is stopped at the end.

usage: upstream_connections.py SRC N
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import tempfile

from gateway_instructions import CONFIG, KEY, PY, body, free_port, send, wait_ready


def sockets(port: int) -> tuple[int, int]:
    """(the gateway's established connections to `port`, TIME-WAIT sockets on either side)."""
    table = subprocess.run(
        ["ss", "-Htan", f"( dport = :{port} or sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in table.splitlines() if line.strip()]
    established = sum(r[0] == "ESTAB" and r[4].endswith(f":{port}") for r in rows)
    return established, sum(r[0] == "TIME-WAIT" for r in rows)


def main() -> None:
    src, n = sys.argv[1], int(sys.argv[2])
    sim_port, port = free_port(), free_port()
    sim = subprocess.Popen(
        [
            *(PY, "-m", "sluicegate", "sim", "--time-scale", "0"),
            *("--host", "127.0.0.1", "--port", str(sim_port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with tempfile.TemporaryDirectory(prefix="upstream-conns-") as work:
        config = os.path.join(work, "gateway.yaml")
        with open(config, "w") as f:
            f.write(CONFIG)
        env = {
            **os.environ,
            "PYTHONPATH": os.path.abspath(src),
            "SLUICEGATE_BENCH_KEY": KEY,
            "SLUICEGATE_SIM_URL": f"http://127.0.0.1:{sim_port}",
        }
        gateway = subprocess.Popen(
            [
                *(PY, "-m", "sluicegate", "serve", "--config", config, "--host", "127.0.0.1"),
                *("--port", str(port), "--log-level", "warning"),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_ready(f"http://127.0.0.1:{sim_port}/health", 60)
            wait_ready(f"http://127.0.0.1:{port}/ready", 60)
            for mode in ("plain", "stream"):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                before = sockets(sim_port)
                for _ in range(n):
                    send(conn, body(mode == "stream"))
                after = sockets(sim_port)
                conn.close()
                print(
                    f"{mode}: {n} requests; to the simulator (established, time-wait): "
                    f"before {before}, after {after}"
                )
        finally:
            gateway.send_signal(signal.SIGINT)
            gateway.wait(30)
            sim.send_signal(signal.SIGINT)
            sim.wait(30)


if __name__ == "__main__":
    main()
