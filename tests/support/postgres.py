"""The real PostgreSQL the store tests use: reachable, or skipped with the reason, except
that CI=true makes its absence a failure."""

from __future__ import annotations

import os

import asyncpg
import pytest

POSTGRES_DSN = os.environ.get(
    "SLUICEGATE_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)


async def connect_or_skip() -> asyncpg.Connection:
    try:
        return await asyncpg.connect(POSTGRES_DSN, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL is not reachable at {POSTGRES_DSN} ({exc!r})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI=true requires it")
        pytest.skip(reason)
