"""The job store for several replicas: PostgreSQL through an asyncpg pool.

Every connection's `search_path` is the configured schema, so the shared statements
need no schema names; the schema is created, under the migration lock, on open.

Every wait is bounded: taking a connection from the pool by `acquire_timeout_s`, each
statement by the server's `statement_timeout` and by the same bound on the client (a
server that stopped answering never reports its own timeout). Running out of either,
or losing the connection, is `JobStoreUnavailable`: a 503 to the caller, a retry for the
workers, and the transaction rolled back.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from sluicegate.core.clock import Clock
from sluicegate.jobs.clock import UnixClock
from sluicegate.jobs.schema import migrate
from sluicegate.jobs.sql import POSTGRES, Row, Session, bind
from sluicegate.jobs.sqlstore import SqlJobStore
from sluicegate.jobs.store import JobStoreUnavailable

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_OUTAGE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.QueryCanceledError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.ReadOnlySQLTransactionError,
)
"""The driver's ways of saying the database is away, slow, shutting down, or a standby."""


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

    def __init__(self, pool: asyncpg.Pool, acquire_timeout_s: float | None) -> None:
        self._pool = pool
        self._acquire_timeout_s = acquire_timeout_s

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Session]:
        try:
            async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
                yield _PostgresSession(conn)
        except _OUTAGE as err:
            raise JobStoreUnavailable(err) from err

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Session]:
        try:
            async with (
                self._pool.acquire(timeout=self._acquire_timeout_s) as conn,
                conn.transaction(),
            ):
                yield _PostgresSession(conn)
        except _OUTAGE as err:
            raise JobStoreUnavailable(err) from err

    async def close(self) -> None:
        await self._pool.close()


async def open_postgres(
    dsn: str,
    schema: str = "sluicegate",
    clock: Clock | None = None,
    max_connections: int = 10,
    statement_timeout_s: float = 30.0,
    acquire_timeout_s: float = 5.0,
) -> SqlJobStore:
    """Connect to `dsn` and open the job store in `schema`, creating and migrating it.

    Migrations run first, on a connection of their own without the statement bounds: an
    index built over a large table, or a wait for another replica's migration, may take
    longer than any request should."""
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"schema {schema!r} is not a lower-case SQL identifier")
    clock = clock or UnixClock()
    migrator = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=1,
        timeout=acquire_timeout_s,
        server_settings={"search_path": schema},
    )
    try:
        await migrate(
            PostgresDatabase(migrator, None),
            clock.now(),
            (f"CREATE SCHEMA IF NOT EXISTS {schema}",),
        )
    finally:
        await migrator.close()
    settings = {"search_path": schema, "statement_timeout": str(int(statement_timeout_s * 1000))}
    pool = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=max_connections,
        timeout=acquire_timeout_s,
        command_timeout=statement_timeout_s + 1.0,
        server_settings=settings,
    )
    return SqlJobStore(PostgresDatabase(pool, acquire_timeout_s), clock)
