"""The checker interface's own rules: masking, and the contract test on a scripted checker."""

from __future__ import annotations

import re

import pytest

from sluicegate.guardrails.checker import PASSED, Span, Stage, Verdict, mask
from tests.unit.guardrails.contract import check_contract


class Digits:
    """A scripted checker: flags runs of five or more digits."""

    name = "digits"

    async def check(self, text: str, stage: Stage) -> Verdict:
        spans = tuple(Span(m.start(), m.end(), "number") for m in re.finditer(r"\d{5,}", text))
        return Verdict(True, spans, ("number",)) if spans else PASSED


class Unsorted(Digits):
    async def check(self, text: str, stage: Stage) -> Verdict:
        verdict = await super().check(text, stage)
        return Verdict(verdict.flagged, tuple(reversed(verdict.spans)), verdict.categories)


def test_a_mask_replaces_each_span_by_its_kind() -> None:
    text = "call 12345 or 67890 now"
    spans = [Span(5, 10, "phone"), Span(14, 19, "phone")]
    assert mask(text, spans) == "call [PHONE] or [PHONE] now"


def test_overlapping_spans_mask_once() -> None:
    assert mask("abcdefgh", [Span(3, 6, "y"), Span(1, 4, "x")]) == "a[X]gh"


def test_no_spans_leave_the_text_as_it_is() -> None:
    assert mask("plain", []) == "plain"


async def test_a_checker_that_keeps_its_promises_passes_the_contract() -> None:
    await check_contract(Digits(), ["id 123456", "a 99999 b 88888"], ["id 1234", "no digits"])


async def test_the_contract_fails_a_checker_with_unsorted_spans() -> None:
    with pytest.raises(AssertionError):
        await check_contract(Unsorted(), ["a 99999 b 88888"], ["clean"])


async def test_the_contract_fails_a_checker_that_misses() -> None:
    with pytest.raises(AssertionError):
        await check_contract(Digits(), ["1234"], ["clean"])
