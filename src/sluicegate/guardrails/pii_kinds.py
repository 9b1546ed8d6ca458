"""How each kind of personal data is found: a candidate pattern, then a validator.

Every pattern is anchored by look-arounds so that no match starts or ends inside a
longer token, its quantifiers are bounded and its repetitions are separated by
characters they cannot consume, so a search does work linear in the text (a bounded
amount per start position). A candidate is kept only when its validator, a
maintained library where one exists, agrees: phonenumbers for phone numbers,
python-stdnum for the Luhn check, IBANs and US SSNs, the standard library's
`ipaddress` for IP addresses. A finder yields `None` after each validation it runs,
so that its caller can bound the work done per event-loop turn; each kind says what a
validation costs in characters of scanning, as measured (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from sluicegate.guardrails.extra import needs_extra

with needs_extra("the PII checker"):
    import phonenumbers
    from phonenumbers import re_util
    from stdnum import iban, luhn
    from stdnum.us import ssn

Found = tuple[int, int] | None
"""A span's offsets, or None for one unit of validation work done."""

_EMAIL = re.compile(
    r"(?<![\w.%+\-])[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.){1,8}[A-Za-z]{2,24}"
    r"(?![\w\-@]|\.[A-Za-z0-9])"
)
_PHONE = re.compile(r"(?<![\w+.\-/(])(?:\+|\(\+?)?\d(?:[ .\-/()]{0,2}\d){5,19}(?![\w]|[.\-/]\d)")
_CARD = re.compile(r"(?<![\w.\-+])\d(?:[ \-]?\d){11,22}(?![\w]|[\-.]\d)")
_IBAN = re.compile(r"(?<![\w])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,38}(?![\w])")
_SSN = re.compile(r"(?<![\w\-])\d{3}([ \-])\d{2}\1\d{4}(?![\w]|-\d)")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w]|\.\d)")
_IPV6 = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:(?:\d{1,3}\.){3}\d{1,3}|[0-9A-Fa-f]{0,4})"
    r"(?![\w:]|\.\d)"
)
_API_KEY = re.compile(
    r"(?<![\w\-])(?:"
    r"sk-(?:proj-|ant-(?:api|admin)\d\d-)?[A-Za-z0-9_\-]{20,200}"
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{36}"
    r"|github_pat_[A-Za-z0-9_]{60,100}"
    r"|xox[baprs]-[A-Za-z0-9\-]{10,100}"
    r"|AIza[0-9A-Za-z_\-]{35}"
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,99}"
    r"|eyJ[A-Za-z0-9_\-]{8,300}\.eyJ[A-Za-z0-9_\-]{8,300}\.[A-Za-z0-9_\-]{8,300}"
    r")(?![\w\-])"
)
_NOT_PHONE = re.compile(
    r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}"  # dates
    r"|\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}"  # IPv4 addresses
    r"|\d+\.\d+"  # decimals
)
_SPACE = re.compile(r"\s+")
MAX_TRIMS = 3
"""Neighbouring groups a candidate may have swallowed at each end."""

# Issuer prefixes (IIN ranges) and lengths of the brands whose numbers are recognised.
_BRANDS: tuple[tuple[int, int, int, frozenset[int]], ...] = (
    # prefix digits, first, last, lengths
    (1, 4, 4, frozenset({13, 16, 19})),  # Visa
    (2, 51, 55, frozenset({16})),  # Mastercard
    (4, 2221, 2720, frozenset({16})),  # Mastercard 2-series
    (2, 34, 34, frozenset({15})),  # American Express
    (2, 37, 37, frozenset({15})),
    (4, 6011, 6011, frozenset({16, 17, 18, 19})),  # Discover
    (3, 644, 649, frozenset({16, 17, 18, 19})),
    (2, 65, 65, frozenset({16, 17, 18, 19})),
    (4, 3528, 3589, frozenset({16, 17, 18, 19})),  # JCB
    (3, 300, 305, frozenset({14, 15, 16, 17, 18, 19})),  # Diners Club
    (2, 36, 36, frozenset({14, 15, 16, 17, 18, 19})),
    (2, 38, 39, frozenset({16, 17, 18, 19})),
    (2, 62, 62, frozenset({16, 17, 18, 19})),  # UnionPay
)


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of personal data: its candidate pattern and the test a candidate passes."""

    name: str
    pattern: re.Pattern[str]
    valid: Callable[[str], bool] | None
    """None: the pattern's shape is the whole test."""
    cost: int = 300
    """What one validation costs, in characters of scanning that take as long."""
    trims: bool = False
    """Also try the candidate without leading or trailing space-separated groups: the
    pattern may have swallowed a neighbouring number."""

    def find(self, text: str, start: int, end: int) -> Iterator[Found]:
        """Spans found in `text[start:end]`, looking behind `start` for context."""
        for match in self.pattern.finditer(text, start, end):
            if self.valid is None:
                yield match.span()
                continue
            for offset, stop in _pieces(match.group(), self.trims):
                yield None
                if self.valid(match.group()[offset:stop]):
                    yield match.start() + offset, match.start() + stop
                    break


def _pieces(candidate: str, trims: bool) -> Iterator[tuple[int, int]]:
    """The candidate whole, then (when `trims`) without up to MAX_TRIMS space-separated
    groups at its end, then at its start."""
    yield 0, len(candidate)
    if not trims:
        return
    gaps = [(gap.start(), gap.end()) for gap in _SPACE.finditer(candidate)]
    for gap_start, _ in reversed(gaps[-MAX_TRIMS:]):
        yield 0, gap_start
    for _, gap_end in gaps[:MAX_TRIMS]:
        yield gap_end, len(candidate)


def _digits(text: str) -> str:
    return "".join(char for char in text if char.isdigit())


def _card(candidate: str) -> bool:
    digits = _digits(candidate)
    if not 12 < len(digits) < 20 or len(set(candidate) - _DIGITS) > 1:
        return False
    branded = any(
        first <= int(digits[:width]) <= last and len(digits) in lengths
        for width, first, last, lengths in _BRANDS
    )
    return branded and luhn.is_valid(digits)


_DIGITS = frozenset("0123456789")


def _iban(candidate: str) -> bool:
    return iban.is_valid(candidate, check_country=False)


def _ssn(candidate: str) -> bool:
    return ssn.is_valid(candidate.replace(" ", "-"))


def _ipv4(candidate: str) -> bool:
    try:
        ipaddress.IPv4Address(candidate)
    except ValueError:
        return False
    return True


def _ipv6(candidate: str) -> bool:
    """Valid, and with a digit: `a::b` and `dead::beef` are code far more often."""
    if not any(char.isdigit() for char in candidate):
        return False
    try:
        ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return True


def _secret(candidate: str) -> bool:
    """An `sk-` key mixes letters and digits; prose such as `sk-learn-...` does not."""
    if not candidate.startswith("sk-"):
        return True
    body = candidate[3:]
    return any(char.isdigit() for char in body) and any(char.isalpha() for char in body)


def phone_validator(regions: Sequence[str]) -> Callable[[str], bool]:
    """Valid in its own country when written with `+` or `00`; otherwise valid in one of
    `regions` and written with a separator (a bare run of digits is far more often an
    order number than a phone number)."""

    def valid(candidate: str) -> bool:
        digits = _digits(candidate)
        if not 7 <= len(digits) <= 17 or _NOT_PHONE.fullmatch(candidate):
            return False
        if candidate.startswith(("+", "(+")):
            return _valid_number(candidate, None)
        if digits.startswith("00") and len(digits) > 9:
            return _valid_number("+" + digits[2:], None)
        if candidate.isdigit():
            return False
        return any(_valid_national(candidate, digits, region) for region in regions)

    _warm_every_country()
    return valid


@functools.cache
def _warm_every_country() -> None:
    """Validate an example number of every country, written both ways, once per
    process at start: phonenumbers reads a country's metadata and compiles its patterns
    the first time a number of it turns up, which would otherwise happen on the event
    loop mid-scan (a `+` number may be of any country). The compiled patterns are kept:
    there are more of them than the `re` module's own cache holds."""
    re_util.enable_pattern_cache()
    for region in phonenumbers.SUPPORTED_REGIONS:
        example = phonenumbers.example_number(region)
        if example is not None:
            _valid_number(
                phonenumbers.format_number(example, phonenumbers.PhoneNumberFormat.E164), None
            )
            national = phonenumbers.format_number(example, phonenumbers.PhoneNumberFormat.NATIONAL)
            _valid_national(national, _digits(national), region)


def _parsed(candidate: str, region: str | None) -> phonenumbers.PhoneNumber | None:
    try:
        number = phonenumbers.parse(candidate, region)
    except phonenumbers.NumberParseException:
        return None
    return number if phonenumbers.is_valid_number(number) else None


def _valid_number(candidate: str, region: str | None) -> bool:
    return _parsed(candidate, region) is not None


def _valid_national(candidate: str, digits: str, region: str) -> bool:
    """Written as the country writes it: with its trunk prefix (the 0 of 030 in
    Germany), unless the country's numbering plan lets it go (India). Otherwise any long
    number reads as some country's fixed line without its trunk prefix."""
    number = _parsed(candidate, region)
    if number is None:
        return False
    national = _digits(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL))
    if digits == national:
        return True
    return region in _TRUNK_OPTIONAL and digits == phonenumbers.national_significant_number(number)


_TRUNK_OPTIONAL = frozenset(
    region
    for region in phonenumbers.SUPPORTED_REGIONS
    if any(
        rule.national_prefix_optional_when_formatting
        for rule in phonenumbers.PhoneMetadata.metadata_for_region(region).number_format
    )
)


def kinds(regions: Sequence[str]) -> dict[str, tuple[Kind, ...]]:
    """Every kind by name; national phone numbers are read as numbers of `regions`."""
    return {
        "email": (Kind("email", _EMAIL, None),),
        "phone": (Kind("phone", _PHONE, phone_validator(regions), 1500 * len(regions)),),
        "card": (Kind("card", _CARD, _card, 800, trims=True),),
        "iban": (Kind("iban", _IBAN, _iban, 1000, trims=True),),
        "ssn": (Kind("ssn", _SSN, _ssn),),
        "ip": (Kind("ip", _IPV4, _ipv4), Kind("ip", _IPV6, _ipv6)),
        "api_key": (Kind("api_key", _API_KEY, _secret),),
    }


KINDS = ("api_key", "email", "iban", "card", "ssn", "ip", "phone")
"""Every kind the PII checker knows, the most specific first: where two overlap, the
first names the item."""

SUPPORTED_REGIONS = frozenset(phonenumbers.SUPPORTED_REGIONS)
