"""A prompt-injection heuristic: the phrasings that try to override a model's
instructions, change its persona, pull out its system prompt or forge a chat turn.

It is a cheap first line, not a classifier: it catches the common, literal attempts
and nothing paraphrased beyond its patterns; a guard model behind it catches more, at
a model call's cost. Each pattern allows a few words between its parts, a bounded gap
of word / non-word runs that cannot overlap, and no run of whitespace that could span
lines follows a line start, so a scan stays linear in the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sluicegate.guardrails.checker import PASSED, Stage, Verdict
from sluicegate.guardrails.scan import WORK_PER_TURN, scan

_GAP = r"\W+(?:\w+\W+){0,3}?"
"""Up to three words between two parts of a phrase."""

FAMILIES: dict[str, str] = {
    "override": (
        rf"\b(?:ignore|disregard|forget|override|bypass)\b{_GAP}"
        r"(?:previous|prior|above|earlier|preceding|system|original|initial)\W+"
        r"(?:\w+\W+)?(?:instructions?|prompts?|rules|directions|guidelines|messages)\b"
    ),
    "persona": (
        r"\b(?:you\s+are\s+now|from\s+now\s+on\s+you\s+are|act\s+as|pretend\s+to\s+be)\W+"
        r"(?:\w+\W+){0,2}?(?:DAN|unrestricted|unfiltered|jailbroken|uncensored|evil)\b"
        r"|\bdo\s+anything\s+now\b|\bdeveloper\s+mode\s+(?:enabled|on)\b"
    ),
    "exfiltration": (
        rf"\b(?:reveal|print|show|repeat|output|leak|tell\s+me)\b{_GAP}"
        r"(?:system\s+prompt|hidden\s+(?:instructions|prompt)|initial\s+instructions"
        r"|instructions\s+above)\b"
    ),
    "role_markup": (
        r"<\|im_start\|>\s*system|<\|start_header_id\|>\s*system|\[/?INST\]"
        r"|<<SYS>>|^[ \t]*#{2,}[ \t]*(?:system|instruction)s?[ \t]*:"
    ),
}
"""Each family of attempts, by the category it reports."""


@dataclass(frozen=True, slots=True)
class _Phrases:
    name: str
    pattern: re.Pattern[str]
    cost: int = 0

    def find(self, text: str, start: int, end: int) -> Iterator[tuple[int, int] | None]:
        for match in self.pattern.finditer(text, start, end):
            yield match.span()


class InjectionChecker:
    """Flags the phrases of the chosen families, each span named by its family."""

    def __init__(self, families: Iterable[str] = tuple(FAMILIES), name: str = "injection") -> None:
        wanted = tuple(dict.fromkeys(families))
        unknown = [family for family in wanted if family not in FAMILIES]
        if unknown or not wanted:
            raise ValueError(
                f"injection families {unknown or 'none'} are not among {', '.join(FAMILIES)}"
            )
        self.name = name
        self._finders = tuple(
            _Phrases(family, re.compile(FAMILIES[family], re.IGNORECASE | re.MULTILINE))
            for family in wanted
        )

    async def check(self, text: str, stage: Stage) -> Verdict:
        spans = await scan(text, self._finders, WORK_PER_TURN)
        if not spans:
            return PASSED
        spans.sort(key=lambda span: (span.start, span.end, span.kind))
        return Verdict(True, tuple(spans), tuple(sorted({span.kind for span in spans})))
