"""Size limits: the span is what lies past the limit."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.guardrails.checker import Stage, Verdict
from sluicegate.guardrails.size import SizeChecker
from tests.unit.guardrails.contract import check_contract


def _check(checker: SizeChecker, text: str) -> Verdict:
    return asyncio.run(checker.check(text, Stage.OUTPUT))


async def test_the_size_checker_keeps_the_checkers_promises() -> None:
    checker = SizeChecker(max_chars=70_000, max_lines=3)
    await check_contract(checker, ["a\nb\nc\nd", "x" * 70_001], ["short", "a\nb\nc\n"])


def test_a_text_over_its_characters_is_cut_at_the_limit() -> None:
    verdict = _check(SizeChecker(max_chars=5), "abcdefgh")
    assert verdict.categories == ("max_chars",)
    assert [(s.start, s.end) for s in verdict.spans] == [(5, 8)]
    assert not _check(SizeChecker(max_chars=5), "abcde").flagged


def test_a_text_over_its_lines_is_cut_after_the_last_line_allowed() -> None:
    verdict = _check(SizeChecker(max_lines=2), "one\ntwo\nthree\nfour")
    assert verdict.categories == ("max_lines",)
    assert [(s.start, s.end) for s in verdict.spans] == [(8, 18)]
    assert not _check(SizeChecker(max_lines=2), "one\ntwo\n").flagged


def test_the_tighter_of_two_limits_cuts() -> None:
    verdict = _check(SizeChecker(max_chars=6, max_lines=1), "ab\ncdefgh")
    assert verdict.categories == ("max_chars", "max_lines")
    assert verdict.spans[0].start == 3


@pytest.mark.parametrize("limits", [{}, {"max_chars": 0}, {"max_lines": -1}, {"max_chars": True}])
def test_bad_limits_are_refused_by_name(limits: dict) -> None:
    with pytest.raises(ValueError, match="max_"):
        SizeChecker(**limits)
