"""The supervisor of `serve --workers N`, with stand-in workers (tiny Python processes)."""

from __future__ import annotations

import sys
import time

from sluicegate.app import build
from sluicegate.observability.siblings import Seat
from sluicegate.supervisor import RESTARTS, Supervisor
from tests.config.test_config import base, parse


def test_a_worker_that_keeps_dying_stops_the_server(tmp_path, capsys):
    directory = tmp_path / "run"
    directory.mkdir()
    marks = tmp_path / "starts"
    marks.mkdir()
    code = f"import os, pathlib; pathlib.Path({str(marks)!r}, str(os.getpid())).touch(); exit(3)"

    def argv(index: int) -> list[str]:
        return (
            [sys.executable, "-c", code]
            if index == 0
            else [sys.executable, "-c", "import time; time.sleep(60)"]
        )

    began = time.monotonic()
    assert Supervisor(argv, 2, directory, grace_s=5).run() == 1
    assert time.monotonic() - began < 30
    err = capsys.readouterr().err
    assert err.count("worker 0 exited with 3; restarting it") == RESTARTS
    assert f"died more than {RESTARTS} times" in err
    assert len(list(marks.iterdir())) == RESTARTS + 1
    assert not directory.exists()  # the run directory goes with the server


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
