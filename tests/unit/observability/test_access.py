"""The access log's writer: lines reach the file off the event loop, a full queue drops
and counts rather than waits, and `sampled` keeps every failure."""

from __future__ import annotations

import json
from pathlib import Path

from sluicegate.observability import access
from sluicegate.observability.access import AccessLog


def test_lines_reach_the_file_as_json_with_their_time(tmp_path: Path):
    path = tmp_path / "access.log"
    log = AccessLog("on", path=path)
    log.start()
    log.write({"request_id": "r1", "status": 200})
    log.write({"request_id": "r2", "status": 503})
    log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == ["r1", "r2"]
    assert lines[0]["time"].endswith("Z")


def test_sampled_keeps_every_failure_and_a_share_of_successes():
    draws = iter([0.5, 0.05])
    log = AccessLog("sampled", 0.1, draw=lambda: next(draws))
    assert log.wanted(succeeded=False)
    assert not log.wanted(succeeded=True)
    assert log.wanted(succeeded=True)
    assert AccessLog("on", 0.1, draw=lambda: 0.99).wanted(succeeded=True)


def test_a_writer_that_is_behind_costs_dropped_lines_never_a_wait(monkeypatch, tmp_path: Path):
    """The writer is not started: nothing drains the queue, as with a stalled disk."""
    monkeypatch.setattr(access, "QUEUE_LINES", 3)
    dropped: list[int] = []
    log = AccessLog("on", path=tmp_path / "x", dropped=lambda: dropped.append(1))
    for i in range(10):
        log.write({"i": i})
    assert len(dropped) == 7
