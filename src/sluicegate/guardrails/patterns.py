"""A plug-in checker matching regular expressions: the smallest in-house check, and the
example the plug-in interface is documented with (`sluicegate.guardrails.patterns:Patterns`)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from sluicegate.guardrails.checker import PASSED, Span, Stage, Verdict


class Patterns:
    """`patterns` maps a kind to the expression that finds it."""

    def __init__(self, patterns: Mapping[str, str], name: str = "patterns") -> None:
        self.name = name
        self._found = [(kind, re.compile(expression)) for kind, expression in patterns.items()]

    async def check(self, text: str, stage: Stage) -> Verdict:
        spans = [
            Span(m.start(), m.end(), kind)
            for kind, expression in self._found
            for m in expression.finditer(text)
            if m.end() > m.start()
        ]
        if not spans:
            return PASSED
        spans.sort(key=lambda s: (s.start, s.end))
        return Verdict(True, tuple(spans), tuple(sorted({s.kind for s in spans})))
