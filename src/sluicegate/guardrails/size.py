"""Size limits: a text longer than a route allows, in characters or in lines.

The span is what lies past the limit, so a mask cuts the text there.
"""

from __future__ import annotations

from sluicegate.guardrails.checker import PASSED, Span, Stage, Verdict


class SizeChecker:
    """Flags a text over `max_chars` characters or `max_lines` lines."""

    def __init__(
        self, max_chars: int | None = None, max_lines: int | None = None, name: str = "size"
    ) -> None:
        for field, value in (("max_chars", max_chars), ("max_lines", max_lines)):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"size limit {field} must be a positive integer, not {value!r}")
        if max_chars is None and max_lines is None:
            raise ValueError("size limits: set max_chars, max_lines or both")
        self.name = name
        self._max_chars = max_chars
        self._max_lines = max_lines

    async def check(self, text: str, stage: Stage) -> Verdict:
        cut = len(text)
        categories = []
        if self._max_chars is not None and len(text) > self._max_chars:
            cut = self._max_chars
            categories.append("max_chars")
        if self._max_lines is not None:
            at = _line_end(text, self._max_lines)
            if at is not None:
                cut = min(cut, at)
                categories.append("max_lines")
        if not categories:
            return PASSED
        return Verdict(True, (Span(cut, len(text), "size"),), tuple(categories))


def _line_end(text: str, lines: int) -> int | None:
    """Where the line after the first `lines` begins, if the text has one."""
    if text.count("\n") < lines:
        return None
    at = -1
    for _ in range(lines):
        at = text.find("\n", at + 1)
        if at < 0:
            return None
    return at + 1 if at + 1 < len(text) else None
