"""The little the shared store needs from a database driver, and how SQL text differs.

Statements are written once with `:name` parameters; `bind` fills in the dialect's
words and numbers the parameters in its style (`?1` for SQLite, `$1` for PostgreSQL),
reusing a number for a repeated name, so each driver receives positional arguments.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

Row = dict[str, Any]


@dataclass(frozen=True, slots=True, eq=False)
class Dialect:
    """What differs in SQL text: the parameter style and the words statements name in braces
    (`{blob}`, `{real}`, `{bigint}` in DDL; `{for_update}`, `{skip_locked}` after a SELECT).
    """

    placeholder: str
    words: Mapping[str, str]


SQLITE = Dialect(
    placeholder="?{}",
    words={
        "blob": "BLOB",
        "real": "REAL",
        "bigint": "INTEGER",
        "for_update": "",
        "skip_locked": "",
    },
)
POSTGRES = Dialect(
    placeholder="${}",
    words={
        "blob": "BYTEA",
        "real": "DOUBLE PRECISION",
        "bigint": "BIGINT",
        "for_update": "FOR UPDATE",
        "skip_locked": "FOR UPDATE SKIP LOCKED",
    },
)


class Session(Protocol):
    async def fetch(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run one statement; its rows (those of RETURNING too) as dicts."""
        ...

    async def lock(self, key: str) -> None:
        """Serialise the transactions that lock `key` until this one ends."""
        ...


class Database(Protocol):
    dialect: Dialect

    def read(self) -> AbstractAsyncContextManager[Session]:
        """A session for statements that each stand alone."""
        ...

    def write(self) -> AbstractAsyncContextManager[Session]:
        """A transaction, committed durably on normal exit and rolled back otherwise."""
        ...

    async def close(self) -> None: ...


_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@functools.lru_cache(maxsize=256)
def _compile(query: str, dialect: Dialect) -> tuple[str, tuple[str, ...]]:
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return dialect.placeholder.format(names.setdefault(match[1], len(names) + 1))

    return _PARAM.sub(number, query.format_map(dialect.words)), tuple(names)


def bind(query: str, params: Mapping[str, Any], dialect: Dialect) -> tuple[str, list[Any]]:
    """`query` in `dialect`'s words and parameter style, and its arguments in order."""
    text, names = _compile(query, dialect)
    return text, [params[name] for name in names]


def in_list(column: str, values: Collection[Any]) -> tuple[str, dict[str, Any]]:
    """`column IN (...)` with one parameter per value; no values match nothing."""
    params = {f"{column}_{i}": value for i, value in enumerate(values)}
    if not params:
        return "1 = 0", params
    return f"{column} IN ({', '.join(':' + name for name in params)})", params
