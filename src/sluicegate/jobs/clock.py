"""The job store's default clock: jobs outlive processes, so their times are unix seconds."""

from __future__ import annotations

import time


class UnixClock:
    __slots__ = ()

    def now(self) -> float:
        return time.time()
