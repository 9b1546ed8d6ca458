"""What a guardrail checker answers: which parts of this text break its rule?

A checker knows its rule and nothing else: not the route, the time budget, the failure
mode or the cache, which the guardrail around it owns. It may raise on any failure of
its own (a classifier that is down, an answer it cannot read); the guardrail turns that
into its configured failure mode. Spans are half-open character offsets into the text it
was given, so a mask can replace exactly what was found and nothing else.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


class Stage(enum.StrEnum):
    """Whose text is checked: the caller's prompt or the model's answer."""

    INPUT = "input"
    OUTPUT = "output"


@dataclass(frozen=True, slots=True)
class Span:
    """Characters `[start, end)` of the checked text, found to be of `kind`."""

    start: int
    end: int
    kind: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """A checker's answer: flagged or not, with where (spans) and what (categories)."""

    flagged: bool
    spans: tuple[Span, ...] = ()
    categories: tuple[str, ...] = ()


PASSED = Verdict(flagged=False)


class Checker(Protocol):
    """One rule applied to one text; raises when it cannot answer."""

    name: str

    async def check(self, text: str, stage: Stage) -> Verdict: ...


def mask(text: str, spans: Iterable[Span]) -> str:
    """The text with each span replaced by its kind in brackets; overlapping spans merge."""
    merged: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Span(last.start, max(last.end, span.end), last.kind)
        else:
            merged.append(span)
    parts: list[str] = []
    at = 0
    for span in merged:
        parts.append(text[at : span.start])
        parts.append(f"[{span.kind.upper()}]")
        at = span.end
    parts.append(text[at:])
    return "".join(parts)
