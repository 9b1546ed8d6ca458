"""A progress bar on stderr: redrawn in place on a terminal, a line now and then in a log."""

from __future__ import annotations

import sys
from typing import TextIO

WIDTH = 30
LOG_EVERY = 10
"""Draws between lines when stderr is not a terminal (a CI log wants few lines)."""


class Progress:
    def __init__(self, total_s: float, out: TextIO = sys.stderr) -> None:
        self._total_s = total_s
        self._out = out
        self._live = out.isatty()
        self._draws = 0

    def draw(self, elapsed_s: float, status: str, *, force: bool = False) -> None:
        self._draws += 1
        if not (self._live or force or self._draws % LOG_EVERY == 1):
            return
        done = min(1.0, elapsed_s / self._total_s)
        filled = round(WIDTH * done)
        bar = "#" * filled + "-" * (WIDTH - filled)
        line = f"[{bar}] {elapsed_s:5.1f}/{self._total_s:g} s  {status}"
        self._out.write(f"\r{line}\x1b[K" if self._live else f"{line}\n")
        self._out.flush()

    def close(self, elapsed_s: float, status: str) -> None:
        """The last state, always shown, and the cursor left on a fresh line."""
        self.draw(elapsed_s, status, force=True)
        if self._live:
            self._out.write("\n")
            self._out.flush()
