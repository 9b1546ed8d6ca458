"""`serve --workers N`: a parent process that keeps N gateway workers running on one port.

Each worker is a whole gateway in its own process, binding its own `SO_REUSEPORT`
socket, so the kernel spreads connections over the workers evenly; they share limits
through the Redis store as replicas of a fleet do. The parent serves no traffic: it
holds the port (bound, not listening) so no other program takes it while a worker
restarts; restarts a worker that dies, at once after a steady life and after a growing
delay while it keeps dying (`Backoff`), so one that cannot stay up costs little and the
others keep serving; asks each worker on its sibling socket whether it is alive and
replaces one whose event loop stopped answering (`Liveness`); and on SIGTERM or SIGINT
stops every worker gracefully. Workers are started with `children.spawn`, so they die
with the parent however it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from sluicegate.children import spawn

log = logging.getLogger("sluicegate.workers")

CHECK_S = 1.0
"""The longest the parent sleeps between checks of its workers, signal or not."""
RESTARTS = "SLUICEGATE_WORKER_RESTARTS"
"""The environment variable telling a worker how often its seat was restarted."""
ALIVE = b"alive"
"""What a worker answers on its sibling socket when asked whether it is alive."""


class Backoff:
    """When a dead worker may start again: at once when it had lived `steady_s`, else
    after a delay that doubles with each quick death in a row, from `base_s` to
    `cap_s`."""

    def __init__(
        self,
        now: Callable[[], float],
        base_s: float = 0.5,
        cap_s: float = 30.0,
        steady_s: float = 60.0,
    ) -> None:
        self._now = now
        self._base_s = base_s
        self._cap_s = cap_s
        self._steady_s = steady_s
        self._started: dict[int, float] = {}
        self._quick: dict[int, int] = {}

    def started(self, index: int) -> None:
        self._started[index] = self._now()

    def died(self, index: int) -> float:
        """When worker `index`, dead now, may start again."""
        now = self._now()
        if now - self._started.get(index, now) >= self._steady_s:
            self._quick[index] = 0
            return now
        quick = self._quick.get(index, 0)
        self._quick[index] = quick + 1
        return now + min(self._cap_s, self._base_s * 2**quick)


class Liveness:
    """Whether a worker still answers: one that answered before and then misses `misses`
    asks in a row, or never answered within `startup_s` of starting, is hung."""

    def __init__(self, now: Callable[[], float], misses: int = 3, startup_s: float = 30.0) -> None:
        self._now = now
        self._misses = misses
        self._startup_s = startup_s
        self._started: dict[int, float] = {}
        self._answered: set[int] = set()
        self._missed: dict[int, int] = {}

    def started(self, index: int) -> None:
        self._started[index] = self._now()
        self._answered.discard(index)
        self._missed[index] = 0

    def asked(self, index: int, answered: bool) -> bool:
        """Record one ask; True when the worker is hung and should be replaced."""
        if answered:
            self._answered.add(index)
            self._missed[index] = 0
            return False
        if index not in self._answered:
            return self._now() - self._started.get(index, self._now()) > self._startup_s
        self._missed[index] = self._missed.get(index, 0) + 1
        return self._missed[index] >= self._misses


def alive(path: Path, timeout_s: float) -> bool:
    """Whether the worker listening at `path` answers within `timeout_s`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            sock.sendall(b"alive\n")
            return sock.recv(len(ALIVE)) == ALIVE
        except OSError:
            return False


def run_directory() -> Path:
    """Where the workers' sibling sockets live, private to this server."""
    return Path(tempfile.mkdtemp(prefix="sluicegate-workers-"))


class Supervisor:
    """Starts `count` workers with `argv(index)` and keeps them until told to stop; asks
    each whether it is alive every `ask_every_s` at `address(index)`."""

    def __init__(
        self,
        argv: Callable[[int], Sequence[str]],
        count: int,
        directory: Path,
        grace_s: float,
        address: Callable[[int], Path],
        backoff: Backoff | None = None,
        liveness: Liveness | None = None,
        ask_every_s: float = 5.0,
    ) -> None:
        self._argv = argv
        self._count = count
        self._directory = directory
        self._grace_s = grace_s
        self._address = address
        self._backoff = backoff or Backoff(time.monotonic)
        self._liveness = liveness or Liveness(time.monotonic)
        self._ask_every_s = ask_every_s
        self._stopping = False
        self._workers: dict[int, subprocess.Popen[bytes]] = {}
        self._due: dict[int, float] = {}
        """Dead workers and when each may start again."""
        self._restarts: dict[int, int] = {}

    def run(self) -> int:
        """Until SIGTERM/SIGINT (0).

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
            for index in range(self._count):
                self._start(index)
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
        asked_s = time.monotonic()
        while not self._stopping:
            now = time.monotonic()
            wait_s = min([CHECK_S, *(due - now for due in self._due.values())])
            readable, _, _ = select.select([wake], [], [], max(0.0, wait_s))
            if readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 512)
            if self._stopping:
                break
            for index, worker in list(self._workers.items()):
                code = worker.poll()
                if code is not None:
                    self._buried(index, f"exited with {code}")
            now = time.monotonic()
            for index, due in list(self._due.items()):
                if due <= now:
                    del self._due[index]
                    self._start(index)
            if now - asked_s >= self._ask_every_s:
                asked_s = now
                self._ask_each()
        return 0

    def _ask_each(self) -> None:
        """Replace each worker that stopped answering: its event loop is stuck, and it
        holds connections the kernel keeps sending it."""
        for index, worker in list(self._workers.items()):
            answered = alive(self._address(index), timeout_s=min(2.0, self._ask_every_s))
            if self._liveness.asked(index, answered):
                worker.kill()
                worker.wait()
                self._buried(index, "stopped answering and was killed")

    def _buried(self, index: int, how: str) -> None:
        del self._workers[index]
        due = self._backoff.died(index)
        self._due[index] = due
        delay_s = max(0.0, due - time.monotonic())
        when = "at once" if delay_s < 0.01 else f"in {delay_s:.1f}s"
        log.warning(
            "worker %d %s; restarting it %s",
            index,
            how,
            when,
            extra={"always": True},
        )

    def _start(self, index: int) -> None:
        if index in self._restarts:
            self._restarts[index] += 1
        else:
            self._restarts[index] = 0
        self._workers[index] = worker = self._spawn(index)
        log.info("worker %d started (pid %d)", index, worker.pid, extra={"always": True})
        self._backoff.started(index)
        self._liveness.started(index)

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        """In a session of its own, so a terminal's Ctrl-C reaches only the parent,
        which passes it on as one SIGTERM; told how often its seat was restarted, which
        it exports (the parent serves no metrics)."""
        env = {**os.environ, RESTARTS: str(self._restarts[index])}
        return spawn(self._argv(index), start_new_session=True, env=env)

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
