"""Server-sent events, framed in one place for every adapter and the edge.

Upstream bytes arrive cut anywhere; an event ends at a blank line, and a line may end
with `\\r\\n`, `\\n` or `\\r`. An event's data is its `data:` lines joined by newlines.
Relaying stays a byte pass-through: `EventSplitter.feed` hands back whole events as
the bytes that arrived, and only the code that must look inside an event (the usage
event the gateway asked for, another provider's events to translate) splits them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

MAX_EVENT_BYTES = 1 << 20
"""An event longer than this (1 MiB) is an upstream that never ends its event."""

_LINE = re.compile(rb"([^\r\n]*)(\r\n|\r|\n)")
_BLANK = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


class EventTooLarge(ValueError):
    """An event grew past `MAX_EVENT_BYTES` without ending."""


def frame(data: bytes) -> bytes:
    """One event carrying `data` (each of its lines a `data:` line)."""
    if b"\n" not in data and b"\r" not in data:
        return b"data: " + data + b"\n\n"
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def events(block: bytes, start: int = 0) -> Iterator[tuple[bytes, bytes | None]]:
    """Each whole event in `block` from `start` (an event's first byte) on, as (its bytes,
    its data or None without data lines)."""
    data: list[bytes] = []
    for line in _LINE.finditer(block, start):
        content = line.group(1)
        if not content:
            yield block[start : line.end()], b"\n".join(data) if data else None
            start, data = line.end(), []
        elif content.startswith(b"data:"):
            value = content[5:]
            data.append(value[1:] if value.startswith(b" ") else value)


def event_start(block: bytes, at: int) -> int:
    """Where the event holding byte `at` (on a line that is not blank) of `block` begins,
    so a caller looking for one event splits only from there. Exact for `\\n` endings, a
    search from `at` backwards; with any `\\r` in `block`, 0 (its start)."""
    if b"\r" in block:
        return 0
    blank = block.rfind(b"\n\n", 0, at)
    if blank >= 0:
        return blank + 2
    return 1 if block.startswith(b"\n") else 0


class EventSplitter:
    """Buffers a stream's bytes and hands back whole events only."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        """The whole events completed by `data` (b"" when none), as they arrived."""
        data = self._pending + data if self._pending else data
        # A final \r may be the first half of \r\n: it ends nothing until the next byte.
        cut = _end_of_last_event(data[:-1] if data.endswith(b"\r") else data)
        self._pending = data[cut:]
        if len(self._pending) > MAX_EVENT_BYTES:
            raise EventTooLarge(f"an event passed {MAX_EVENT_BYTES} bytes without ending")
        return data[:cut]

    def rest(self) -> bytes:
        """Bytes after the last whole event, at the end of the stream."""
        rest, self._pending = self._pending, b""
        return rest


def _end_of_last_event(data: bytes) -> int:
    """Where the last blank line in `data` ends; 0 when there is none. The common case,
    `\\n\\n` endings, costs one search from the end."""
    plain = data.rfind(b"\n\n")
    if b"\r" not in data:
        return plain + 2 if plain >= 0 else 0
    last = 0
    for match in _BLANK.finditer(data):
        last = match.end()
    return last
