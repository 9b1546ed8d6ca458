"""The operator log: a timestamp, level, worker and request id on every line, and a
repeating message written once a window with the count of those left out."""

from __future__ import annotations

import io
import logging
import re

from sluicegate.core.ids import RequestContext, current
from sluicegate.observability.logs import Lines, Repeats, operator_handler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def logger_to(stream: io.StringIO, name: str, handler: logging.Handler | None = None):
    logger = logging.getLogger(name)
    logger.handlers = [handler or operator_handler("3", stream)]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def test_a_line_names_its_time_level_worker_and_request():
    out = io.StringIO()
    log = logger_to(out, "test.logs.context")
    token = current.set(RequestContext("req-7"))
    try:
        log.warning("deployment %s failed", "a")
    finally:
        current.reset(token)
    log.info("no request here")
    first, second = out.getvalue().splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING worker=3 request_id=req-7 "
        r"test\.logs\.context: deployment a failed",
        first,
    )
    assert "INFO worker=3 request_id=- " in second


def test_a_repeated_failure_is_written_once_a_window_with_the_count_left_out():
    clock = Clock()
    repeats = Repeats(10.0, clock)
    seen = [repeats.due("k") for _ in range(5)]
    assert seen == [0, None, None, None, None]
    clock.now += 10
    assert repeats.due("k") == 4
    assert repeats.due("other") == 0


def test_the_handler_leaves_a_flood_out_and_says_how_much_it_left_out():
    out = io.StringIO()
    log = logger_to(out, "test.logs.flood")
    for _ in range(50):
        log.warning("release notifications lost (%s); resubscribing", "refused")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1


def test_occurrences_with_their_own_keys_are_kept_apart_and_always_ones_are_never_left_out():
    out = io.StringIO()
    log = logger_to(out, "test.logs.keys")
    for reason in ("a", "b", "a"):
        log.warning("refused: %s", reason, extra={"repeat_key": reason})
    for _ in range(3):
        log.warning("stream cut", extra={"always": True})
    text = out.getvalue()
    assert text.count("refused: a") == 1
    assert text.count("refused: b") == 1
    assert text.count("stream cut") == 3


def test_hot_path_lines_are_decided_before_a_record_is_built():
    clock = Clock()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logger_to(io.StringIO(), "test.logs.lines", Keep())
    lines = Lines(log, Repeats(10.0, clock))
    for _ in range(100):
        lines.warning(("refused", "quota"), "refused: %s", "quota")
    clock.now += 11
    lines.warning(("refused", "quota"), "refused: %s", "quota")
    assert [r.getMessage() for r in records] == [
        "refused: quota",
        "refused: quota (99 more like this left out)",
    ]


def test_memory_stays_bounded_under_many_distinct_messages():
    clock = Clock()
    repeats = Repeats(10.0, clock)
    for i in range(20_000):
        repeats.due(i)
    assert len(repeats._seen) <= 4096
