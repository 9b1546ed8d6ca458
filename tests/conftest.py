"""Async tests run on uvloop, the loop `sluicegate serve` runs on (uvicorn picks it), so
a difference between the two loops shows up here rather than in production.

With SLUICEGATE_TEST_MONOTONIC_AT=S set, `time.monotonic()` reads about S seconds at the
start, as on a machine booted S seconds ago, and the standard asyncio loop stands in for
uvloop (which reads the kernel's clock itself). A test that mixes the real clock with a
fake one (whose time starts at 1000) then fails here on any machine, not only on one
booted minutes ago. `make test` runs the unit suite this way.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping

import pytest
import uvloop
from pytest_asyncio.plugin import LoopFactory

MONOTONIC_AT_ENV = "SLUICEGATE_TEST_MONOTONIC_AT"


def _shift_monotonic(at_s: float) -> None:
    real = time.monotonic
    offset = real() - at_s

    def shifted() -> float:
        return real() - offset

    time.monotonic = shifted


_monotonic_at = os.environ.get(MONOTONIC_AT_ENV)
if _monotonic_at is not None:
    _shift_monotonic(float(_monotonic_at))


def pytest_report_header(config: pytest.Config) -> str | None:
    if _monotonic_at is None:
        return None
    return f"time.monotonic() shifted to start at {_monotonic_at} s; standard asyncio loop"


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, LoopFactory]:
    if _monotonic_at is not None:
        return {"asyncio": asyncio.new_event_loop}
    return {"uvloop": uvloop.new_event_loop}
