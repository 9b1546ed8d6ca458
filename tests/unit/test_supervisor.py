"""The supervisor of `serve --workers N`, with stand-in workers (tiny Python processes)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from sluicegate.app import build
from sluicegate.observability.siblings import Seat
from sluicegate.supervisor import RESTARTS, Backoff, Liveness, Supervisor
from tests.config.test_config import base, parse


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_worker_that_keeps_dying_waits_longer_each_time_and_one_that_lived_goes_at_once():
    clock = Clock()
    backoff = Backoff(clock, base_s=0.5, cap_s=4.0, steady_s=60.0)
    delays = []
    for _ in range(6):
        backoff.started(0)
        clock.t += 1.0
        delays.append(backoff.died(0) - clock.t)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.started(0)
    clock.t += 61.0
    assert backoff.died(0) == clock.t
    backoff.started(0)
    clock.t += 1.0
    assert backoff.died(0) - clock.t == 0.5, "a steady life forgets the quick deaths"
    backoff.started(1)
    clock.t += 1.0
    assert backoff.died(1) - clock.t == 0.5, "each worker counts its own"


def test_a_worker_is_hung_after_missing_asks_in_a_row_or_never_answering_at_start():
    clock = Clock()
    liveness = Liveness(clock, misses=3, startup_s=30.0)
    liveness.started(0)
    clock.t += 20.0
    assert not liveness.asked(0, answered=False), "still starting"
    assert not liveness.asked(0, answered=True)
    assert not liveness.asked(0, answered=False)
    assert not liveness.asked(0, answered=False)
    assert not liveness.asked(0, answered=True), "an answer resets the count"
    assert [liveness.asked(0, answered=False) for _ in range(3)] == [False, False, True]
    liveness.started(1)
    clock.t += 31.0
    assert liveness.asked(1, answered=False), "never answered within its start-up time"


ANSWERING = """
import os, socket, sys
path = sys.argv[1]
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen()
while True:
    conn, _ = server.accept()
    if conn.recv(64).strip() == b"alive" and not os.path.exists(path + ".hang"):
        conn.sendall(b"alive")
    conn.close()
"""


def test_a_dead_worker_is_restarted_and_a_hung_one_replaced_until_sigterm(tmp_path, caplog):
    """Stand-in workers answer on their socket; worker 0 dies at once every time, so it
    is restarted with growing delays; worker 1 stops answering (its `.hang` file), so it
    is killed and replaced, and the server serves on until it is told to stop."""
    directory = tmp_path / "run"
    directory.mkdir()
    starts = tmp_path / "starts"
    starts.mkdir()

    def address(index: int) -> Path:
        return tmp_path / f"w{index}.sock"

    def argv(index: int) -> list[str]:
        mark = (
            f"import os, pathlib; pathlib.Path({str(starts)!r}, '{index}-' + str(os.getpid())"
            f" + '-' + os.environ[{RESTARTS!r}]).touch()"
        )
        if index == 0:
            return [sys.executable, "-c", f"{mark}; exit(3)"]
        path = address(index)
        return [
            sys.executable,
            "-c",
            f"{mark}\nimport os\nos.path.exists({str(path)!r}) and os.unlink({str(path)!r})\n"
            + ANSWERING,
            str(path),
        ]

    supervisor = Supervisor(
        argv,
        2,
        directory,
        grace_s=2,
        address=address,
        backoff=Backoff(time.monotonic, base_s=0.2, cap_s=0.8, steady_s=60.0),
        liveness=Liveness(time.monotonic, misses=2, startup_s=5.0),
        ask_every_s=0.3,
    )
    stopper = threading.Timer(6.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
    hang = threading.Timer(2.0, lambda: Path(str(address(1)) + ".hang").touch())
    stopper.start()
    hang.start()
    try:
        assert supervisor.run() == 0
    finally:
        stopper.cancel()
        hang.cancel()
    err = caplog.text
    zero = sorted(p for p in starts.iterdir() if p.name.startswith("0-"))
    one = sorted(p for p in starts.iterdir() if p.name.startswith("1-"))
    assert 4 <= len(zero) <= 12, err
    restarts = sorted(int(p.name.rsplit("-", 1)[1]) for p in zero)
    assert restarts == list(range(len(zero))), "each start is told its seat's restarts"
    assert "worker 0 exited with 3; restarting it in 0.2s" in err
    assert "worker 0 exited with 3; restarting it in 0.8s" in err
    assert "worker 1 stopped answering and was killed" in err
    assert len(one) >= 2
    assert not directory.exists()


def test_a_worker_that_starts_with_redis_down_counts_every_worker_in_its_share(tmp_path):
    """Until Redis tells a live count, each of N workers assumes N replicas (or the
    configured count, if larger), so the server admits each limit once, not N times."""
    raw = base()
    raw["store"] = "redis"
    raw["redis"] = {"url": "redis://127.0.0.1:9", "expected_replicas": 1}
    settings = parse(raw)
    alone = build(settings, store_down=True)
    assert alone.shared.live == 1
    for count, expected in ((3, 3), (1, 1)):
        worker = build(settings, store_down=True, seat=Seat(0, count, tmp_path))
        assert worker.shared.live == expected
    raw["redis"]["expected_replicas"] = 5
    worker = build(parse(raw), store_down=True, seat=Seat(1, 3, tmp_path))
    assert worker.shared.live == 5
