"""`serve --workers N`: a parent process that keeps N gateway workers running on one port.

Each worker is a whole gateway in its own process, binding its own `SO_REUSEPORT`
socket, so the kernel spreads connections over the workers evenly; they share limits
through the Redis store as replicas of a fleet do. The parent serves no traffic: it
holds the port (bound, not listening) so no other program takes it while a worker
restarts, restarts a worker that dies (or stops the server when one keeps dying), and
on SIGTERM or SIGINT stops every worker gracefully. Workers are started with
`children.spawn`, so they die with the parent however it ends.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from sluicegate.children import spawn

RESTARTS = 5
"""A worker may die this many times within `RESTART_WINDOW_S` and be restarted; once
more and the server stops, since it would only crash again."""
RESTART_WINDOW_S = 60.0
CHECK_S = 1.0
"""The longest the parent sleeps between checks of its workers, signal or not."""


def run_directory() -> Path:
    """Where the workers' sibling sockets live, private to this server."""
    return Path(tempfile.mkdtemp(prefix="sluicegate-workers-"))


class Supervisor:
    """Starts `count` workers with `argv(index)` and keeps them until told to stop."""

    def __init__(
        self, argv: Callable[[int], Sequence[str]], count: int, directory: Path, grace_s: float
    ) -> None:
        self._argv = argv
        self._count = count
        self._directory = directory
        self._grace_s = grace_s
        self._stopping = False
        self._deaths: collections.deque[float] = collections.deque()
        self._workers: dict[int, subprocess.Popen[bytes]] = {}

    def run(self) -> int:
        """Until SIGTERM/SIGINT (0) or a worker that keeps dying (1).

        Signals wake the loop through `signal.set_wakeup_fd` (written by the
        interpreter's C handler), so the Python handlers only set a flag and never take
        a lock the interrupted code may hold."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        previous_fd = signal.set_wakeup_fd(wake_w)
        previous = {
            sig: signal.signal(sig, self._signalled)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
        }
        try:
            self._workers = {i: self._spawn(i) for i in range(self._count)}
            return self._watch(wake_r)
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_fd)
            os.close(wake_r)
            os.close(wake_w)
            shutil.rmtree(self._directory, ignore_errors=True)

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:
            self._stopping = True

    def _watch(self, wake: int) -> int:
        while not self._stopping:
            readable, _, _ = select.select([wake], [], [], CHECK_S)
            if readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 512)
            if self._stopping:
                break
            for index, worker in list(self._workers.items()):
                code = worker.poll()
                if code is None:
                    continue
                if not self._may_restart():
                    print(
                        f"sluicegate: worker {index} exited with {code}, and workers died more "
                        f"than {RESTARTS} times within {RESTART_WINDOW_S:g}s; stopping the server",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
                print(
                    f"sluicegate: worker {index} exited with {code}; restarting it",
                    file=sys.stderr,
                    flush=True,
                )
                self._workers[index] = self._spawn(index)
        return 0

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        """In a session of its own, so a terminal's Ctrl-C reaches only the parent,
        which passes it on as one SIGTERM."""
        return spawn(self._argv(index), start_new_session=True)

    def _may_restart(self) -> bool:
        now = time.monotonic()
        deaths = self._deaths
        deaths.append(now)
        while deaths and deaths[0] < now - RESTART_WINDOW_S:
            deaths.popleft()
        return len(deaths) <= RESTARTS

    def _stop_all(self) -> None:
        """One SIGTERM each (a second would make uvicorn skip its graceful shutdown),
        then a shared grace period, then SIGKILL for what is left."""
        running = [w for w in self._workers.values() if w.poll() is None]
        for worker in running:
            worker.terminate()
        deadline = time.monotonic() + self._grace_s
        for worker in running:
            try:
                worker.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
