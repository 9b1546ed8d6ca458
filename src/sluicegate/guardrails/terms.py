"""The banned-terms checker: a list of words or phrases, matched as whole words and
without regard to case, in time linear in the text whatever the list holds.

Terms are literals, never patterns, and are matched by an Aho-Corasick automaton
(pyahocorasick, in C): one pass over the case-folded text finds every occurrence of
every term, so no term in config can make a scan backtrack. Case folding can lengthen
a text (`ß` folds to `ss`); the offsets of such a text are mapped back to the original,
so a span covers what the caller wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from sluicegate.guardrails.checker import PASSED, Span, Stage, Verdict
from sluicegate.guardrails.extra import needs_extra

with needs_extra("the banned-terms checker"):
    import ahocorasick

MAX_TERMS = 100_000
MAX_TERM_CHARS = 200
MATCHES_PER_TURN = 500
"""Matches handled before the event loop gets a turn."""
FOLDS_PER_TURN = 4_096
"""Characters folded one by one (a text that folding lengthens) per turn."""


class TermsChecker:
    """Flags each occurrence of a configured term, as a span of its kind."""

    def __init__(
        self,
        terms: Iterable[str],
        name: str = "banned_terms",
        kind: str = "banned_term",
        whole_words: bool = True,
    ) -> None:
        self.name = name
        self._kind = kind
        self._whole_words = whole_words
        self._automaton = ahocorasick.Automaton()
        for index, term in enumerate(terms):
            folded = _checked(index, term).casefold()
            self._automaton.add_word(folded, (len(folded), _word(folded[0]), _word(folded[-1])))
            if index + 1 > MAX_TERMS:
                raise ValueError(f"banned terms: more than {MAX_TERMS} terms")
        if len(self._automaton) == 0:
            raise ValueError("banned terms: the list is empty")
        self._automaton.make_automaton()

    async def check(self, text: str, stage: Stage) -> Verdict:
        folded = text.casefold()
        origin = None if len(folded) == len(text) else await _origins(text)
        spans: list[Span] = []
        for count, (last, (length, word_start, word_end)) in enumerate(
            self._automaton.iter(folded), 1
        ):
            start, end = last + 1 - length, last + 1
            if origin is not None:
                start, end = origin[start], origin[end - 1] + 1
            if self._bounded(text, start, end, word_start, word_end):
                spans.append(Span(start, end, self._kind))
            if count % MATCHES_PER_TURN == 0:
                await asyncio.sleep(0)
        if not spans:
            return PASSED
        if len(spans) > MATCHES_PER_TURN:  # the sort of a long list gets a turn of its own
            await asyncio.sleep(0)
        spans.sort(key=lambda span: (span.start, span.end))
        return Verdict(True, tuple(spans), (self._kind,))

    def _bounded(self, text: str, start: int, end: int, word_start: bool, word_end: bool) -> bool:
        """Whole words only: a term that begins (ends) with a letter or digit does not
        match right after (before) another one."""
        if not self._whole_words:
            return True
        if word_start and start > 0 and _word(text[start - 1]):
            return False
        return not (word_end and end < len(text) and _word(text[end]))


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _checked(index: int, term: object) -> str:
    if not isinstance(term, str) or not term.strip():
        raise ValueError(f"banned terms: term {index} is empty or not a string")
    if len(term) > MAX_TERM_CHARS:
        raise ValueError(f"banned terms: term {index} is longer than {MAX_TERM_CHARS} characters")
    return term.strip()


async def _origins(text: str) -> list[int]:
    """For each character of the folded text, the index of the one it came from."""
    origin: list[int] = []
    for index, char in enumerate(text):
        origin.extend([index] * len(char.casefold()))
        if index % FOLDS_PER_TURN == FOLDS_PER_TURN - 1:
            await asyncio.sleep(0)
    return origin
