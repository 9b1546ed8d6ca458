"""The banned-terms checker: whole words, any case, offsets of the text as written,
linear whatever the list, and a list it refuses by the term's position."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.guardrails.checker import Stage, mask
from sluicegate.guardrails.terms import MAX_TERM_CHARS, TermsChecker
from tests.unit.guardrails.contract import check_contract


def _spans(checker: TermsChecker, text: str) -> list[str]:
    verdict = asyncio.run(checker.check(text, Stage.INPUT))
    return [text[span.start : span.end] for span in verdict.spans]


async def test_the_terms_checker_keeps_the_checkers_promises() -> None:
    checker = TermsChecker(["project falcon", "acme"])
    await check_contract(
        checker,
        ["tell me about Project  Falcon? no: PROJECT FALCON", "ask ACME.", "acme"],
        ["nothing here", "acmeology and macme", "project falconry"],
    )


def test_terms_match_whole_words_only_unless_asked_otherwise() -> None:
    text = "Acme, acmecorp and subacme"
    assert _spans(TermsChecker(["acme"]), text) == ["Acme"]
    assert _spans(TermsChecker(["acme"], whole_words=False), text) == ["Acme", "acme", "acme"]


def test_a_term_with_punctuation_at_its_ends_needs_no_word_boundary_there() -> None:
    assert _spans(TermsChecker(["$$$"]), "win$$$now") == ["$$$"]


def test_case_folding_that_lengthens_the_text_keeps_the_offsets_of_the_text_as_written() -> None:
    checker = TermsChecker(["strasse"])
    text = "Die Straße und die STRASSE, ß" * 3
    verdict = asyncio.run(checker.check(text, Stage.INPUT))
    assert [text[s.start : s.end] for s in verdict.spans] == ["Straße", "STRASSE"] * 3
    assert mask(text, verdict.spans).startswith("Die [BANNED_TERM] und die [BANNED_TERM], ß")


def test_overlapping_terms_are_each_reported() -> None:
    assert _spans(TermsChecker(["red", "red team"]), "the red team") == ["red", "red team"]


def test_a_list_built_to_make_a_regex_backtrack_is_matched_in_one_pass() -> None:
    checker = TermsChecker(["a" * n + "b" for n in range(1, 150)])
    assert _spans(checker, "a" * 50_000) == []
    assert _spans(checker, "a" * 5 + "b") == ["aaaaab"]


def test_a_bad_list_is_refused_naming_the_term() -> None:
    with pytest.raises(ValueError, match="term 1 is empty"):
        TermsChecker(["ok", "  "])
    with pytest.raises(ValueError, match=f"term 0 is longer than {MAX_TERM_CHARS}"):
        TermsChecker(["x" * (MAX_TERM_CHARS + 1)])
    with pytest.raises(ValueError, match="empty"):
        TermsChecker([])
