"""Child processes that cannot outlive the command that started them.

A child started with `spawn` asks the kernel (Linux `PR_SET_PDEATHSIG`) for SIGTERM
when its parent dies, however the parent dies: a SIGKILL leaves no chance to clean up,
and a supervisor that stops the parent must not be left with an orphaned simulator.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

_PR_SET_PDEATHSIG = 1


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **popen)`, bound to die with this process."""
    return subprocess.Popen(argv, preexec_fn=_die_with(os.getpid()), **popen)


def _die_with(parent: int) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def bind() -> None:
        """Runs in the child between fork and exec: nothing here may take a lock."""
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return bind


def stop(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM lets a server drain and shut down cleanly; kill only what ignores it."""
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(timeout=grace_s)
