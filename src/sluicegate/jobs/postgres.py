"""The job store for several replicas: PostgreSQL through an asyncpg pool.

Every connection's `search_path` is the configured schema, so the shared statements
need no schema names; the schema is created, under the migration lock, on open.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from sluicegate.core.clock import Clock
from sluicegate.jobs.clock import UnixClock
from sluicegate.jobs.sql import POSTGRES, Row, Session, bind
from sluicegate.jobs.sqlstore import SqlJobStore

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class _PostgresSession:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def fetch(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        text, args = bind(query, params or {}, POSTGRES)
        return [dict(record) for record in await self._conn.fetch(text, *args)]

    async def lock(self, key: str) -> None:
        await self._conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", key)


class PostgresDatabase:
    dialect = POSTGRES

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Session]:
        async with self._pool.acquire() as conn:
            yield _PostgresSession(conn)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Session]:
        async with self._pool.acquire() as conn, conn.transaction():
            yield _PostgresSession(conn)

    async def close(self) -> None:
        await self._pool.close()


async def open_postgres(
    dsn: str,
    schema: str = "sluicegate",
    clock: Clock | None = None,
    max_connections: int = 10,
) -> SqlJobStore:
    """Connect to `dsn` and open the job store in `schema`, creating and migrating it."""
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"schema {schema!r} is not a lower-case SQL identifier")
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=max_connections, server_settings={"search_path": schema}
    )
    setup = (f"CREATE SCHEMA IF NOT EXISTS {schema}",)
    return await SqlJobStore.open(PostgresDatabase(pool), clock or UnixClock(), setup)
