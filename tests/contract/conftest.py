"""The job stores the contract suite runs against.

SQLite lives in the test's temporary directory; PostgreSQL in a schema of its own,
dropped afterwards. Without a reachable PostgreSQL its half of the suite is skipped,
unless `CI=true`, where that is a failure.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import asyncpg
import pytest

from sluicegate.jobs.postgres import open_postgres
from sluicegate.jobs.sqlite import open_sqlite
from sluicegate.jobs.sqlstore import SqlJobStore
from tests.support.clock import FakeClock
from tests.support.postgres import POSTGRES_DSN, connect_or_skip

OpenStore = Callable[[], Awaitable[SqlJobStore]]


@pytest.fixture(scope="session")
async def postgres_dsn() -> str:
    """Probed once: an unreachable server costs one timeout, not one per test."""
    conn = await connect_or_skip()
    await conn.close()
    return POSTGRES_DSN


@asynccontextmanager
async def _stores(opener: OpenStore) -> AsyncIterator[OpenStore]:
    """Opens stores on one database, as separate processes or replicas would; closes them."""
    async with AsyncExitStack() as stack:

        async def open_one() -> SqlJobStore:
            store = await opener()
            stack.push_async_callback(store.close)
            return store

        yield open_one


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_700_000_000.0)


@pytest.fixture
async def sqlite_stores(tmp_path, clock) -> AsyncIterator[OpenStore]:
    async with _stores(functools.partial(open_sqlite, tmp_path / "jobs.db", clock)) as opener:
        yield opener


@pytest.fixture
async def postgres_schema(postgres_dsn) -> AsyncIterator[str]:
    conn = await asyncpg.connect(postgres_dsn)
    schema = f"sluicegate_test_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


@pytest.fixture
async def postgres_stores(postgres_dsn, postgres_schema, clock) -> AsyncIterator[OpenStore]:
    open_in_schema = functools.partial(open_postgres, postgres_dsn, postgres_schema, clock, 4)
    async with _stores(open_in_schema) as opener:
        yield opener


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request) -> OpenStore:
    return request.getfixturevalue(f"{request.param}_stores")


@pytest.fixture
async def store(open_store) -> SqlJobStore:
    return await open_store()
