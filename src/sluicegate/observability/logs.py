"""The operator's log: one line per event, each naming when, how bad, which worker and,
where there is one, which request; a message that repeats is written once per window
with a count of what was left out, so a flood (Redis down, a deployment failing every
attempt) costs a line every few seconds rather than the disk.

    2026-12-07T13:54:03.123Z WARNING worker=1 request_id=9f2c... sluicegate: ...
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Hashable

from sluicegate.core.ids import current

REPEAT_WINDOW_S = 10.0
"""How often a repeating message may be written."""
MAX_KEYS = 4096
"""Messages remembered at once; past it, those quiet for a window are forgotten."""
FORMAT = (
    "%(asctime)s %(levelname)s worker=%(worker)s request_id=%(request_id)s %(name)s: %(message)s"
)


class Repeats:
    """Which occurrences of a repeating message to write: the first, then one a window,
    each saying how many were left out since the last one written."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, now: Callable[[], float] = time.monotonic
    ) -> None:
        self._window_s = window_s
        self._now = now
        self._seen: dict[Hashable, tuple[float, int]] = {}
        """Per message: when it was last written, and how many were left out since."""

    def due(self, key: Hashable) -> int | None:
        """None to leave this occurrence out; else the count left out before it."""
        now = self._now()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self._window_s:
            self._seen[key] = (seen[0], seen[1] + 1)
            return None
        if seen is None and len(self._seen) >= MAX_KEYS:
            self._forget(now)
        self._seen[key] = (now, 0)
        return 0 if seen is None else seen[1]

    def _forget(self, now: float) -> None:
        quiet = [k for k, (at, _) in self._seen.items() if now - at >= self._window_s]
        for key in quiet or list(self._seen):
            del self._seen[key]


class RepeatFilter(logging.Filter):
    """`Repeats` for every record a handler writes, keyed by its logger, level and
    message template, or by the `repeat_key` a caller gives (`extra=`) to tell apart
    occurrences the template alone would merge (one key per refusal reason). A record
    marked `always` is an event each of whose occurrences counts (a worker's death, a
    stream cut at shutdown) and is never left out."""

    def __init__(self, repeats: Repeats | None = None) -> None:
        super().__init__()
        self._repeats = repeats or Repeats()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "always", False):
            return True
        key = getattr(record, "repeat_key", None)
        if key is None:
            key = (record.name, record.levelno, record.msg)
        left_out = self._repeats.due(key)
        if left_out is None:
            return False
        if left_out:
            record.msg = f"{record.getMessage()} ({left_out} more like this left out)"
            record.args = None
        return True


class ContextFilter(logging.Filter):
    """Adds the worker's index and the running request's id to every record."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self._worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self._worker
        context = current.get()
        record.request_id = "-" if context is None else context.request_id
        return True


class UtcFormatter(logging.Formatter):
    converter = time.gmtime

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", self.converter(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"


def operator_handler(worker: str, stream: object = None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.addFilter(ContextFilter(worker))
    handler.addFilter(RepeatFilter())
    handler.setFormatter(UtcFormatter(FORMAT))
    return handler


def configure(level: str, worker: str) -> None:
    """Send every logger's records (the gateway's and uvicorn's) to stderr in the
    operator's format, at `level` and above."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(operator_handler(worker))
    root.setLevel(level.upper())


class Lines:
    """A logger for lines that may come with every request (refusals, upstream
    failures): whether one is written is decided before its record is built, so a flood
    costs a dict lookup per occurrence, not a formatted record dropped later."""

    def __init__(self, logger: logging.Logger, repeats: Repeats | None = None) -> None:
        self._logger = logger
        self._repeats = repeats or Repeats()

    def warning(self, key: Hashable, message: str, *args: object) -> None:
        left_out = self._repeats.due(key)
        if left_out is None:
            return
        if left_out:
            message = f"{message} ({left_out} more like this left out)"
        self._logger.warning(message, *args, extra={"repeat_key": key})
