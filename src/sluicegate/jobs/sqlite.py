"""The embedded job store: one SQLite file in WAL mode, synced on every commit.

aiosqlite runs each statement on the connection's own thread, so the event loop never
blocks on disk. One connection serves the process and a lock gives it to one session at
a time; `BEGIN IMMEDIATE` takes the file's write lock up front, which makes each write,
claims included, exclusive across processes too.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from sluicegate.core.clock import Clock
from sluicegate.jobs.clock import UnixClock
from sluicegate.jobs.sql import SQLITE, Row, Session, bind
from sluicegate.jobs.sqlstore import SqlJobStore

_WAL_RETRY_PAUSES_S = (0.01, 0.05, 0.1, 0.5, 1.0)


class _SqliteSession:
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def fetch(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        text, args = bind(query, params or {}, SQLITE)
        async with self._conn.execute(text, args) as cursor:
            return [dict(row) for row in await cursor.fetchall()]

    async def lock(self, key: str) -> None:
        """Nothing to do: `BEGIN IMMEDIATE` already serialises every write."""


class SqliteDatabase:
    dialect = SQLITE

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._session = _SqliteSession(conn)
        self._turn = asyncio.Lock()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Session]:
        async with self._turn:
            yield self._session

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Session]:
        async with self._turn:
            try:
                # Inside the try: a cancel while BEGIN runs on the connection's thread must
                # still roll back, or every later write on this connection fails.
                await self._conn.execute("BEGIN IMMEDIATE")
                yield self._session
                await self._conn.commit()
            except BaseException:
                await self._conn.rollback()
                raise

    async def close(self) -> None:
        await self._conn.close()


async def connect_sqlite(path: str | Path) -> SqliteDatabase:
    """Connect to the database file at `path`, creating it, in WAL mode with full sync."""
    conn = await aiosqlite.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        await conn.execute("PRAGMA busy_timeout=10000")
        await _use_wal(conn)
        await conn.execute("PRAGMA synchronous=FULL")
    except BaseException:
        await conn.close()
        raise
    return SqliteDatabase(conn)


async def _use_wal(conn: aiosqlite.Connection) -> None:
    """SQLite refuses at once, without waiting, to switch a new file that another opener
    is switching too; the loser retries and finds it switched."""
    for pause_s in _WAL_RETRY_PAUSES_S:
        with contextlib.suppress(sqlite3.OperationalError):
            await _switch_to_wal(conn)
            return
        await asyncio.sleep(pause_s)
    await _switch_to_wal(conn)


async def _switch_to_wal(conn: aiosqlite.Connection) -> None:
    async with conn.execute("PRAGMA journal_mode=WAL") as cursor:
        row = await cursor.fetchone()
    mode = row[0] if row else None
    if mode != "wal":
        raise RuntimeError(f"SQLite keeps journal_mode {mode}, not WAL")


async def open_sqlite(path: str | Path, clock: Clock | None = None) -> SqlJobStore:
    """Open the job database at `path`, creating and migrating it as needed."""
    return await SqlJobStore.open(await connect_sqlite(path), clock or UnixClock())
