"""Async tests run on uvloop, the loop `sluicegate serve` runs on (uvicorn picks it), so
a difference between the two loops shows up here rather than in production."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import uvloop
from pytest_asyncio.plugin import LoopFactory


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, LoopFactory]:
    return {"uvloop": uvloop.new_event_loop}
