"""The embedded job store: one SQLite file in WAL mode, synced on every commit.

aiosqlite runs each statement on the connection's own thread, so the event loop never
blocks on disk. One connection serves the process and a lock gives it to one session at
a time; `BEGIN IMMEDIATE` takes the file's write lock up front, which makes each write,
claims included, exclusive across processes too. Foreign keys are enforced, so a file's
chunks go with it, as in PostgreSQL.
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
from sluicegate.jobs.store import JobStoreUnavailable

_WAL_RETRY_PAUSES_S = (0.01, 0.05, 0.1, 0.5, 1.0)
_OUTAGE = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CANTOPEN")
"""Error names (prefixes) that mean the file is busy or failing, not that a statement is wrong."""


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

    def __init__(self, conn: aiosqlite.Connection, turn_timeout_s: float) -> None:
        self._conn = conn
        self._session = _SqliteSession(conn)
        self._turn = asyncio.Lock()
        self._turn_timeout_s = turn_timeout_s

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Session]:
        async with self._turn_taken():
            yield self._session

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Session]:
        async with self._turn_taken():
            try:
                # Inside the try: a cancel while BEGIN runs on the connection's thread must
                # still roll back, or every later write on this connection fails.
                await self._conn.execute("BEGIN IMMEDIATE")
                yield self._session
                await self._conn.commit()
            except BaseException:
                await self._conn.rollback()
                raise

    @asynccontextmanager
    async def _turn_taken(self) -> AsyncIterator[None]:
        """The connection, waited for no longer than the bound; a locked or failing file
        (busy past `busy_timeout`, a disk error) is `JobStoreUnavailable`."""
        try:
            async with asyncio.timeout(self._turn_timeout_s):
                await self._turn.acquire()
        except TimeoutError as err:
            raise JobStoreUnavailable("the SQLite connection stayed busy") from err
        try:
            yield
        except sqlite3.OperationalError as err:
            if err.sqlite_errorname.startswith(_OUTAGE):
                raise JobStoreUnavailable(err) from err
            raise
        finally:
            self._turn.release()

    async def close(self) -> None:
        await self._conn.close()


async def connect_sqlite(path: str | Path, timeout_s: float = 10.0) -> SqliteDatabase:
    """Connect to the database file at `path`, creating it, in WAL mode with full sync;
    a statement waits at most `timeout_s` for another process's lock, a session as long
    for this process's connection."""
    conn = await aiosqlite.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        await conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        await _use_wal(conn)
        await conn.execute("PRAGMA synchronous=FULL")
        await conn.execute("PRAGMA foreign_keys=ON")
    except BaseException:
        await conn.close()
        raise
    return SqliteDatabase(conn, timeout_s)


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


async def open_sqlite(
    path: str | Path, clock: Clock | None = None, timeout_s: float = 10.0
) -> SqlJobStore:
    """Open the job database at `path`, creating and migrating it as needed."""
    return await SqlJobStore.open(await connect_sqlite(path, timeout_s), clock or UnixClock())
