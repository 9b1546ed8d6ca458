"""How the workers of one `serve --workers N` see each other.

Every worker answers on a Unix socket in the server's run directory (one line asks,
the answer follows and the connection closes), so `/metrics` and `/admin/status` on
any worker can report the whole server. Asking is bounded: a sibling that does not
answer within `timeout_s` (busy, restarting, gone) is left out and reported missing,
never waited for longer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ANSWER_LIMIT = 16 * 1024 * 1024
"""The most a sibling's answer may hold; a larger one is dropped as if missing."""


@dataclass(frozen=True, slots=True)
class Seat:
    """Which worker this process is, of how many, and where their sockets live."""

    index: int
    count: int
    directory: Path
    restarts: int = 0
    """How often the supervisor restarted this seat's worker."""

    def socket(self, index: int) -> Path:
        return self.directory / f"{index}.sock"

    @property
    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]


class Siblings:
    """Answers the siblings' questions with `answer(kind)`, and asks theirs."""

    def __init__(self, seat: Seat, answer: Callable[[str], bytes], timeout_s: float = 1.0) -> None:
        self.seat = seat
        self._answer = answer
        self._timeout_s = timeout_s
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        path = self.seat.socket(self.seat.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by this seat's previous worker, which died
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def ask(self, kind: str) -> dict[int, Any]:
        """Every sibling's answer that came within the bound, parsed as JSON, by worker
        index. An answer that does not parse (the sibling failed before writing it, or
        died while it did) is left out, as one that came too late."""
        others = self.seat.others
        answers = await asyncio.gather(*(self._ask_one(i, kind) for i in others))
        parsed: dict[int, Any] = {}
        for index, body in zip(others, answers, strict=True):
            if body is not None:
                with contextlib.suppress(orjson.JSONDecodeError):
                    parsed[index] = orjson.loads(body)
        return parsed

    async def _ask_one(self, index: int, kind: str) -> bytes | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                reader, writer = await asyncio.open_unix_connection(self.seat.socket(index))
                try:
                    writer.write(kind.encode() + b"\n")
                    return await _read_all(reader)
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                kind = (await reader.readline()).strip().decode()
                writer.write(self._answer(kind))
                await writer.drain()
        except (OSError, TimeoutError, UnicodeDecodeError):
            pass
        finally:
            writer.close()


async def _read_all(reader: asyncio.StreamReader) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while chunk := await reader.read(65536):
        size += len(chunk)
        if size > ANSWER_LIMIT:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
