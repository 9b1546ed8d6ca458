"""A monotonic clock that policy code receives instead of reading time itself."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale; only differences are meaningful."""
        ...


class MonotonicClock:
    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()
