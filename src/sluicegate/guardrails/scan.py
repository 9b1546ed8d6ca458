"""Pattern scans cut into bounded turns of the event loop.

A scan is CPU work on the loop's thread, and a thread would not take it off the loop
(the GIL). It is cut instead: the text is read in chunks, each chunk's window running
on far enough to see whole every match that starts in it, and the scan hands the loop
back whenever the work done since its last turn passes a bound. Work is counted in
characters scanned by one pattern; a finder says what one of its validations costs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Protocol

from sluicegate.guardrails.checker import Span

CHUNK_CHARS = 4096
"""Characters read per chunk."""

LONGEST_MATCH = 1024
"""No finder matches more characters than this, so a window this much longer than its
chunk sees whole every match that starts in the chunk."""

WORK_PER_TURN = 20_000
"""Work done before the loop gets a turn."""


class Finder(Protocol):
    """One pattern, and the test its candidates pass."""

    name: str
    cost: int
    """What one validation costs, in characters of scanning that take as long."""

    def find(self, text: str, start: int, end: int) -> Iterator[tuple[int, int] | None]:
        """Spans found in `text[start:end]`, looking behind `start` for context; None
        after each validation run."""
        ...


async def scan(
    text: str, finders: Sequence[Finder], work_per_turn: int | None = WORK_PER_TURN
) -> list[Span]:
    """Every finder's spans, unsorted; `work_per_turn` None scans in one go."""
    spans: list[Span] = []
    work = 0
    for chunk in range(0, len(text), CHUNK_CHARS):
        end = min(len(text), chunk + CHUNK_CHARS + LONGEST_MATCH)
        for finder in finders:
            work += end - chunk
            for found in finder.find(text, chunk, end):
                if found is None:
                    work += finder.cost
                elif found[0] < chunk + CHUNK_CHARS:
                    spans.append(Span(found[0], found[1], finder.name))
                work = await _turn(work, work_per_turn)
            work = await _turn(work, work_per_turn)
    return spans


async def _turn(work: int, work_per_turn: int | None) -> int:
    """The work still counted after handing the loop a turn if it is due."""
    if work_per_turn is None or work < work_per_turn:
        return work
    await asyncio.sleep(0)
    return 0
