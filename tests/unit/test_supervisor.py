"""The supervisor of `serve --workers N`, with stand-in workers (tiny Python processes)."""

from __future__ import annotations

import sys
import time

from sluicegate.supervisor import RESTARTS, Supervisor


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
