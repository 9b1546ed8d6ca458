"""The chunked scan: every match once, whole, and the loop handed turns even while
nothing is found."""

from __future__ import annotations

import re
from collections.abc import Iterator

from sluicegate.guardrails.scan import CHUNK_CHARS, WORK_PER_TURN, scan
from tests.unit.guardrails.turns import turns_during


class Pattern:
    cost = 0

    def __init__(self, pattern: str) -> None:
        self.name = pattern
        self._pattern = re.compile(pattern)

    def find(self, text: str, start: int, end: int) -> Iterator[tuple[int, int] | None]:
        for match in self._pattern.finditer(text, start, end):
            yield match.span()


async def test_a_scan_that_finds_nothing_still_hands_the_loop_turns() -> None:
    text = "a@" * (WORK_PER_TURN * 4)
    assert await turns_during(scan(text, [Pattern(r"zz")])) >= 4


async def test_each_match_is_found_once_and_whole_across_chunks() -> None:
    text = ("word " * 300 + "needle-in-the-haystack ") * 40
    spans = await scan(text, [Pattern(r"needle-in-the-haystack")])
    starts = sorted(span.start for span in spans)
    assert len(text) > 3 * CHUNK_CHARS
    assert starts == [m.start() for m in re.finditer("needle", text)]
    assert all(span.end - span.start == len("needle-in-the-haystack") for span in spans)
