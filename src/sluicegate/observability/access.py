"""The access log: one JSON line per finished request, for following one request or
counting many with `jq`.

A line holds what the gateway decided and measured (route, model, lane, tenant, status,
refusal or failure code, stage timings, attempts and the deployments tried, tokens, the
SLO verdict, the request id); never a prompt, an output or a key. Writing never waits on
the event loop: lines go to a bounded queue that a thread of its own drains to the file
(or stderr), and a line that finds the queue full is dropped and counted.
"""

from __future__ import annotations

import contextlib
import queue
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

import orjson

Mode = Literal["off", "sampled", "on"]

QUEUE_LINES = 65_536
"""Lines waiting for the writer; past it they are dropped (a disk that stalls must not
grow the gateway's memory)."""
_STOP = b""


class AccessLog:
    """Lines written in `mode`: every request (`on`), or every request that did not
    succeed and `sample` of those that did (`sampled`: failures are what one follows)."""

    def __init__(
        self,
        mode: Mode,
        sample: float = 1.0,
        path: Path | None = None,
        *,
        dropped: Callable[[], None] = lambda: None,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.mode = mode
        self._sample = sample if mode == "sampled" else 1.0
        self._path = path
        self._dropped = dropped
        self._draw = draw
        self._lines: queue.Queue[bytes] = queue.Queue(QUEUE_LINES)
        self._thread: threading.Thread | None = None

    def wanted(self, succeeded: bool) -> bool:
        """Whether this request's line is written; asked before it is built."""
        return not succeeded or self._sample >= 1.0 or self._draw() < self._sample

    def write(self, fields: dict[str, Any]) -> None:
        """Queues the line, stamped with the time it was written (UTC)."""
        line = orjson.dumps(
            {"time": utc_stamp(time.time()), **fields}, option=orjson.OPT_APPEND_NEWLINE
        )
        try:
            self._lines.put_nowait(line)
        except queue.Full:
            self._dropped()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._drain, args=(self._open(),), name="access-log", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Writes what is queued, then stops the writer (a blocking call, made from a
        thread at shutdown)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._lines.put(_STOP)
            thread.join()

    def _open(self) -> IO[bytes]:
        if self._path is None:
            return sys.stderr.buffer
        return self._path.open("ab")

    def _drain(self, out: IO[bytes]) -> None:
        """Writes lines as they come, a batch per write: everything queued meanwhile."""
        lines = self._lines
        try:
            while True:
                batch = [lines.get()]
                with contextlib.suppress(queue.Empty):
                    while len(batch) < 1024:
                        batch.append(lines.get_nowait())
                stop = _STOP in batch
                out.write(b"".join(batch))
                out.flush()
                if stop:
                    return
        finally:
            if out is not sys.stderr.buffer:
                out.close()


def utc_stamp(unix_s: float) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix_s))
    return f"{stamp}.{int(unix_s * 1000) % 1000:03d}Z"
