"""The PII checker: each kind found as its own span, each validator's rule, the chunked
scan that hands the loop back, and the configuration it refuses."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.guardrails.checker import Stage, mask
from sluicegate.guardrails.pii import PiiChecker
from sluicegate.guardrails.scan import CHUNK_CHARS
from tests.unit.guardrails.contract import check_contract
from tests.unit.guardrails.turns import turns_during

FOUND = [
    ("write to jane.doe+news@example.co.uk today", "jane.doe+news@example.co.uk", "email"),
    ("call +44 20 7946 0958 now", "+44 20 7946 0958", "phone"),
    ("call +14155552671 now", "+14155552671", "phone"),
    ("call 0044 20 7946 0958 now", "0044 20 7946 0958", "phone"),
    ("call (415) 555-2671 now", "(415) 555-2671", "phone"),
    ("call 030 12345678 now", "030 12345678", "phone"),
    ("call 06 12 34 56 78 now", "06 12 34 56 78", "phone"),
    ("call 03-1234-5678 now", "03-1234-5678", "phone"),
    ("call 98765 43210 now", "98765 43210", "phone"),
    ("pay 4111 1111 1111 1111 now", "4111 1111 1111 1111", "card"),
    ("pay 5555-5555-5555-4444 now", "5555-5555-5555-4444", "card"),
    ("pay 378282246310005 now", "378282246310005", "card"),
    ("to DE89 3704 0044 0532 0130 00 now", "DE89 3704 0044 0532 0130 00", "iban"),
    ("to GB82WEST12345698765432 now", "GB82WEST12345698765432", "iban"),
    ("ssn 536-22-8901 now", "536-22-8901", "ssn"),
    ("from 192.168.1.20 now", "192.168.1.20", "ip"),
    ("from 2001:db8::8a2e:370:7334 now", "2001:db8::8a2e:370:7334", "ip"),
    ("key sk-proj-abc123DEF456ghi789JKL0 now", "sk-proj-abc123DEF456ghi789JKL0", "api_key"),
    ("key AKIAIOSFODNN7EXAMPLE now", "AKIAIOSFODNN7EXAMPLE", "api_key"),
    ("key ghp_" + "a1B2" * 9 + " now", "ghp_" + "a1B2" * 9, "api_key"),
]

CLEAN = [
    "nothing personal in this sentence at all",
    "pay 4111 1111 1111 1112 now",  # Luhn
    "pay 4111-1111 1111-1111 now",  # mixed separators
    "to DE88 3704 0044 0532 0130 00 now",  # IBAN check digits
    "ssn 666-22-8901 now",  # an area never issued
    "order 4155552671 shipped",  # a bare run of digits is no phone number
    "on 2024-03-15 and 15/03/2024",
    "pi is 3141.5926535",
    "from 192.168.1.256 now",
    "std::vector and a::b",
    "use sk-learn-pipelines-and-more-things today",
    "version 10.0.19045.2965 and v1.2.3.4",
    "uuid 123e4567-e89b-12d3-a456-426614174000",
]


def _found(text: str, kinds: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    checker = PiiChecker() if kinds is None else PiiChecker(kinds)
    verdict = asyncio.run(checker.check(text, Stage.INPUT))
    return [(text[span.start : span.end], span.kind) for span in verdict.spans]


async def test_the_pii_checker_keeps_the_checkers_promises() -> None:
    await check_contract(PiiChecker(), [text for text, _, _ in FOUND], CLEAN)


@pytest.mark.parametrize(("text", "item", "kind"), FOUND)
def test_each_kind_is_found_as_its_own_span(text: str, item: str, kind: str) -> None:
    assert _found(text) == [(item, kind)]


@pytest.mark.parametrize("text", CLEAN)
def test_near_misses_pass(text: str) -> None:
    assert _found(text) == []


def test_a_mask_names_each_item() -> None:
    text = "mail a.b@example.com, card 4111111111111111, iban GB82WEST12345698765432."
    verdict = asyncio.run(PiiChecker().check(text, Stage.OUTPUT))
    assert mask(text, verdict.spans) == "mail [EMAIL], card [CARD], iban [IBAN]."
    assert verdict.categories == ("card", "email", "iban")


def test_digits_inside_an_iban_or_ssn_are_named_by_it_not_as_a_phone() -> None:
    assert _found("to DE89 3704 0044 0532 0130 00 now") == [("DE89 3704 0044 0532 0130 00", "iban")]
    assert _found("ssn 536-22-8901") == [("536-22-8901", "ssn")]


def test_a_neighbouring_group_of_digits_does_not_hide_a_card() -> None:
    assert _found("card 4111 1111 1111 1111 2024") == [("4111 1111 1111 1111", "card")]


def test_a_neighbouring_word_does_not_hide_an_iban() -> None:
    assert _found("DE89 3704 0044 0532 0130 00 EUR") == [("DE89 3704 0044 0532 0130 00", "iban")]


def test_a_plus_before_digits_makes_a_phone_number_not_a_card() -> None:
    assert _found("call +4915127273303 now") == [("+4915127273303", "phone")]


def test_only_the_selected_kinds_are_looked_for() -> None:
    text = "mail a.b@example.com or call +44 20 7946 0958"
    assert _found(text, ("email",)) == [("a.b@example.com", "email")]


def test_a_national_number_is_written_with_its_trunk_prefix_where_one_is_dialled() -> None:
    checker = PiiChecker(regions=("DE",))
    verdict = asyncio.run(checker.check("call 030 12345678, not 30 12345678", Stage.INPUT))
    assert [(span.start, span.end) for span in verdict.spans] == [(5, 17)]


def test_national_numbers_are_read_in_the_configured_regions_only() -> None:
    checker = PiiChecker(regions=("US",))
    verdict = asyncio.run(checker.check("call 030 12345678 or +49 30 12345678", Stage.INPUT))
    assert [(span.start, span.kind) for span in verdict.spans] == [(21, "phone")]


def test_an_item_across_a_chunk_boundary_is_found_whole() -> None:
    for shift in range(1, 20, 3):
        text = "x" * (CHUNK_CHARS - shift) + " 4111 1111 1111 1111 " + "y" * 10
        start = CHUNK_CHARS - shift + 1
        assert [(s.start, s.end) for s in _spans(text)] == [(start, start + 19)]


def _spans(text: str) -> tuple:
    return asyncio.run(PiiChecker(("card",)).check(text, Stage.INPUT)).spans


def test_an_item_in_two_chunk_windows_is_reported_once() -> None:
    text = "x" * (CHUNK_CHARS + 10) + " a.b@example.com " + "y" * (CHUNK_CHARS * 2)
    assert len(asyncio.run(PiiChecker(("email",)).check(text, Stage.INPUT)).spans) == 1


async def test_a_long_scan_hands_the_loop_back_between_bounded_pieces_of_work() -> None:
    text = "call +44 20 7946 0958 or 4111 1111 1111 1111. " * 300
    assert await turns_during(PiiChecker().check(text, Stage.INPUT)) > 10
    assert await turns_during(PiiChecker(work_per_turn=None).check(text, Stage.INPUT)) == 0


def test_unknown_kinds_and_regions_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'passport'"):
        PiiChecker(("email", "passport"))
    with pytest.raises(ValueError, match="'XX'"):
        PiiChecker(regions=("US", "XX"))
    with pytest.raises(ValueError, match="none"):
        PiiChecker(())


async def test_numbers_of_any_country_compile_nothing_on_the_loop() -> None:
    """Every country's metadata and patterns are ready once a checker is built, so the
    first number of a country met mid-scan compiles no pattern on the event loop."""
    from phonenumbers import re_util

    checker = PiiChecker()
    compiled = re_util._COMPILED_PATTERNS
    assert compiled is not None
    before = len(compiled)
    text = (
        "+81 3-1234-5678, +55 11 91234-5678, +7 495 123-45-67, +27 21 123 4567, "
        "+354 551 2345, +679 331 2345, +998 71 123 45 67"
    )
    verdict = await checker.check(text, Stage.INPUT)
    assert [span.kind for span in verdict.spans] == ["phone"] * 7
    assert len(compiled) == before
