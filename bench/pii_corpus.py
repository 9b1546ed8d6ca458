"""A labelled corpus for the PII checker, and its measurement: recall per kind and the
share of clean samples the mask alters.

The positives are made here, independently of the libraries the checker uses: phone
numbers from each country's own numbering shapes, card numbers from brand prefixes
with a Luhn digit computed here, IBANs from each country's BBAN layout with mod-97 check
digits computed here. A positive counts as found only when the mask covers every one of
its characters. The clean samples carry near-misses: Luhn-invalid card numbers, order
ids, versions, UUIDs, dates, amounts, ISBNs.

    .venv/bin/python -m bench.pii_corpus                 # a fresh seed, printed
    .venv/bin/python -m bench.pii_corpus --seed 12345    # replay one
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import random
import string
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from sluicegate.guardrails.checker import Span, Stage
from sluicegate.guardrails.pii import PiiChecker


@dataclass(frozen=True, slots=True)
class Sample:
    text: str
    kind: str | None
    """None: a clean sample."""
    start: int = 0
    end: int = 0
    variant: str = ""
    """The format, brand or country, to tell where misses fall."""


Item = tuple[str, str]
"""A generated value and its variant."""

# --- the positives -----------------------------------------------------------------

_FIRST = ("anna", "ben", "chloe", "david", "elena", "farid", "grace", "hiro", "ines", "jonas")
_LAST = ("smith", "muller", "dubois", "tanaka", "sharma", "rossi", "garcia", "nowak", "kim")
_DOMAINS = (
    "example.com", "mail.example.org", "corp.example.co.uk", "example.de", "startup.io",
    "uni-example.edu", "example.fr", "post.example.jp",
)  # fmt: skip


def email(rng: random.Random) -> Item:
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    local = rng.choice(
        (
            f"{first}.{last}",
            f"{first[0]}{last}{rng.randint(1, 99)}",
            f"{first}+{rng.choice(('news', 'billing', 'x'))}",
            f"{last}_{first}",
        )
    )
    return f"{local}@{rng.choice(_DOMAINS)}", "email"


def _d(rng: random.Random, count: int, first: str = string.digits) -> str:
    return rng.choice(first) + "".join(rng.choice(string.digits) for _ in range(count - 1))


def _us(rng: random.Random) -> tuple[str, str, str]:
    area = rng.choice(("212", "213", "312", "415", "617", "646", "702", "713", "206", "404"))
    exchange = _d(rng, 3, "23456789")
    while exchange[1:] == "11" or exchange == "555":
        exchange = _d(rng, 3, "23456789")
    line = _d(rng, 4)
    shape = rng.choice(("({a}) {e}-{l}", "{a}-{e}-{l}", "{a}.{e}.{l}"))
    return "1", area + exchange + line, shape.format(a=area, e=exchange, l=line)


def _gb(rng: random.Random) -> tuple[str, str, str]:
    choice = rng.randrange(3)
    if choice == 0:
        number = "20" + rng.choice("378") + _d(rng, 7)
        return "44", number, f"0{number[:2]} {number[2:6]} {number[6:]}"
    if choice == 1:
        number = "7" + rng.choice("45789") + _d(rng, 8)
        return "44", number, f"0{number[:4]} {number[4:]}"
    number = "161" + rng.choice("2345789") + _d(rng, 6)
    return "44", number, f"0{number[:3]} {number[3:6]} {number[6:]}"


def _de(rng: random.Random) -> tuple[str, str, str]:
    choice = rng.randrange(3)
    if choice == 0:
        number = rng.choice(("151", "160", "170", "171", "176")) + _d(rng, 8, "123456789")
        return "49", number, f"0{number[:3]} {number[3:]}"
    if choice == 1:
        number = "30" + _d(rng, 8, "123456789")
        return "49", number, f"0{number[:2]} {number[2:]}"
    number = "89" + _d(rng, 7, "123456789")
    return "49", number, f"0{number[:2]} {number[2:]}"


def _fr(rng: random.Random) -> tuple[str, str, str]:
    number = rng.choice("12345") + _d(rng, 8)
    if rng.random() < 0.4:  # mobiles; 0639 and 069x are overseas departments' own
        number = "6" + rng.choice("012345678") + _d(rng, 7)
        while number.startswith("639"):
            number = "6" + rng.choice("012345678") + _d(rng, 7)
    pairs = " ".join(number[i : i + 2] for i in range(1, 9, 2))
    separator = rng.choice((" ", "."))
    return "33", number, f"0{number[0]}{separator}{pairs.replace(' ', separator)}"


def _jp(rng: random.Random) -> tuple[str, str, str]:
    if rng.random() < 0.5:
        number = rng.choice(("90", "80", "70")) + _d(rng, 8, "123456789")
        return "81", number, f"0{number[:2]}-{number[2:6]}-{number[6:]}"
    number = rng.choice("36") + _d(rng, 8, "23456789")
    return "81", number, f"0{number[0]}-{number[1:5]}-{number[5:]}"


def _in(rng: random.Random) -> tuple[str, str, str]:
    number = rng.choice("6789") + _d(rng, 9)
    return "91", number, rng.choice(("0", "")) + f"{number[:5]} {number[5:]}"


_COUNTRIES: dict[str, Callable[[random.Random], tuple[str, str, str]]] = {
    "US": _us, "GB": _gb, "DE": _de, "FR": _fr, "JP": _jp, "IN": _in,
}  # fmt: skip


def phone(rng: random.Random) -> Item:
    country = rng.choice(tuple(_COUNTRIES))
    code, number, national = _COUNTRIES[country](rng)
    form = rng.choice(("e164", "international", "national", "national"))
    if form == "e164":
        return f"+{code}{number}", "e164"
    if form == "international":
        spaced = " ".join(number[i : i + 3] for i in range(0, len(number), 3))
        return f"+{code} {spaced}", "international"
    return national, f"national-{country}"


def _luhn_digit(payload: str) -> str:
    total = 0
    for index, char in enumerate(reversed(payload)):
        value = int(char) * (2 if index % 2 == 0 else 1)
        total += value - 9 if value > 9 else value
    return str((10 - total % 10) % 10)


_CARD_BRANDS: dict[str, tuple[Callable[[random.Random], str], int, tuple[int, ...]]] = {
    "visa": (lambda rng: "4", 16, (4, 4, 4, 4)),
    "mastercard": (lambda rng: str(rng.choice((rng.randint(51, 55), rng.randint(2221, 2720)))),
                   16, (4, 4, 4, 4)),
    "amex": (lambda rng: rng.choice(("34", "37")), 15, (4, 6, 5)),
    "discover": (lambda rng: "6011", 16, (4, 4, 4, 4)),
    "jcb": (lambda rng: str(rng.randint(3528, 3589)), 16, (4, 4, 4, 4)),
    "diners": (lambda rng: "36", 14, (4, 6, 4)),
}  # fmt: skip


def _group(digits: str, groups: tuple[int, ...], separator: str) -> str:
    parts, at = [], 0
    for size in groups:
        parts.append(digits[at : at + size])
        at += size
    return separator.join(parts)


def card_number(rng: random.Random, brand: str, valid: bool) -> str:
    prefix, length, groups = _CARD_BRANDS[brand]
    payload = prefix(rng)
    payload += _d(rng, length - 1 - len(payload))
    check = _luhn_digit(payload)
    if not valid:
        check = str((int(check) + rng.randint(1, 9)) % 10)
    return _group(payload + check, groups, rng.choice(("", " ", " ", "-")))


def card(rng: random.Random) -> Item:
    brand = rng.choice(tuple(_CARD_BRANDS))
    return card_number(rng, brand, valid=True), brand


# BBAN layouts: n digits, a upper-case letters, c letters or digits.
_BBANS = {
    "DE": "18n", "GB": "4a14n", "FR": "10n11c2n", "ES": "20n", "IT": "1a10n12c", "NL": "4a10n",
    "BE": "12n", "CH": "5n12c", "AT": "16n", "PL": "24n", "PT": "21n", "SE": "20n",
    "IE": "4a14n", "DK": "14n",
}  # fmt: skip
_ALPHABETS = {"n": string.digits, "a": string.ascii_uppercase,
              "c": string.digits + string.ascii_uppercase}  # fmt: skip


def _bban(rng: random.Random, layout: str) -> str:
    out, count = [], ""
    for char in layout:
        if char.isdigit():
            count += char
            continue
        out.extend(rng.choice(_ALPHABETS[char]) for _ in range(int(count)))
        count = ""
    return "".join(out)


def iban_number(rng: random.Random, country: str) -> str:
    bban = _bban(rng, _BBANS[country])
    digits = "".join(str(int(char, 36)) for char in bban + country + "00")
    check = f"{98 - int(digits) % 97:02d}"
    return country + check + bban


def iban(rng: random.Random) -> Item:
    country = rng.choice(tuple(_BBANS))
    number = iban_number(rng, country)
    if rng.random() < 0.5:
        number = " ".join(number[i : i + 4] for i in range(0, len(number), 4))
    return number, country


def ssn(rng: random.Random) -> Item:
    area = rng.randint(1, 899)
    while area == 666:
        area = rng.randint(1, 899)
    separator = rng.choice(("-", "-", " "))
    value = f"{area:03d}{separator}{rng.randint(1, 99):02d}{separator}{rng.randint(1, 9999):04d}"
    if value.replace(" ", "-") in ("078-05-1120", "457-55-5462", "219-09-9999"):
        return ssn(rng)
    return value, "dashes" if separator == "-" else "spaces"


def ip(rng: random.Random) -> Item:
    if rng.random() < 0.5:
        return str(ipaddress.IPv4Address(rng.getrandbits(32))), "v4"
    address = ipaddress.IPv6Address((0x2001_0DB8 << 96) | rng.getrandbits(64))
    if rng.random() < 0.5:
        return address.exploded, "v6-full"
    return address.compressed, "v6-short"


def _token(rng: random.Random, count: int, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(count))


_ALNUM = string.ascii_letters + string.digits


def api_key(rng: random.Random) -> Item:
    shapes: dict[str, Callable[[], str]] = {
        "openai": lambda: "sk-proj-" + _token(rng, 48, _ALNUM + "_-"),
        "anthropic": lambda: "sk-ant-api03-" + _token(rng, 90, _ALNUM + "_-"),
        "aws": lambda: "AKIA" + _token(rng, 16, string.ascii_uppercase + string.digits),
        "github": lambda: "ghp_" + _token(rng, 36, _ALNUM),
        "slack": lambda: f"xoxb-{_d(rng, 12)}-{_d(rng, 13)}-{_token(rng, 24, _ALNUM)}",
        "google": lambda: "AIza" + _token(rng, 35, _ALNUM + "_-"),
        "stripe": lambda: "sk_live_" + _token(rng, 24, _ALNUM),
        "jwt": lambda: "eyJhbGciOiJIUzI1NiJ9.eyJ" + _token(rng, 40, _ALNUM) + "."
        + _token(rng, 43, _ALNUM + "_-"),
    }  # fmt: skip
    shape = rng.choice(tuple(shapes))
    key = shapes[shape]()
    while shape in ("openai", "anthropic") and not (
        any(c.isdigit() for c in key[8:]) and any(c.isalpha() for c in key[8:])
    ):
        key = shapes[shape]()
    return key, shape


GENERATORS: dict[str, Callable[[random.Random], Item]] = {
    "email": email, "phone": phone, "card": card, "iban": iban, "ssn": ssn, "ip": ip,
    "api_key": api_key,
}  # fmt: skip

_CONTEXTS = {
    "email": ("Please send the signed contract to {} before Friday.",
              "Contact: {} (billing questions only)", "cc {}; thanks!"),
    "phone": ("You can reach me on {} after 5pm.", "Call back: {}.",
              "Her mobile is {} and she prefers texts."),
    "card": ("Charge it to my card {} please.", "Card number: {}, exp 09/27.",
             "Paid with {} on 2024-03-02."),
    "iban": ("Wire the deposit to {} by Monday.", "IBAN: {}", "Refund account {}, thank you."),
    "ssn": ("My SSN is {} for the form.", "SSN: {}.", "Tax id {} was rejected."),
    "ip": ("The requests came from {} last night.", "Whitelist {} on the firewall.",
           "host={} port=443"),
    "api_key": ("Here is our key {} for the staging env.", "export API_KEY={}",
                "Authorization: Bearer {}"),
}  # fmt: skip


def positive(rng: random.Random, kind: str) -> Sample:
    value, variant = GENERATORS[kind](rng)
    context = rng.choice(_CONTEXTS[kind])
    start = context.index("{}")
    return Sample(context.format(value), kind, start, start + len(value), variant)


# --- the clean samples -------------------------------------------------------------


def _near_misses(rng: random.Random) -> dict[str, Callable[[], str]]:
    return {
        "luhn-invalid card": lambda: card_number(rng, rng.choice(tuple(_CARD_BRANDS)), False),
        "order id": lambda: rng.choice(
            (f"#{_d(rng, 8)}", f"ORD-{rng.randint(2019, 2026)}-{_d(rng, 6)}",
             f"INV-{_d(rng, 5)}-{rng.choice(string.ascii_uppercase)}", _d(rng, 10, "123456789"))
        ),
        "version": lambda: rng.choice(
            (f"v{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 99)}",
             f"{rng.randint(1, 3)}.{rng.randint(0, 12)}.{rng.randint(0, 20)}",
             f"10.0.{rng.randint(17000, 26000)}.{rng.randint(1, 5000)}")
        ),
        "uuid": lambda: str(uuid.UUID(int=rng.getrandbits(128))),
        "date": lambda: rng.choice(
            (f"{rng.randint(2000, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
             f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(2000, 2030)}",
             f"{rng.randint(1, 12):02d}.{rng.randint(1, 28):02d}.{rng.randint(2000, 2030)}",
             f"{rng.randint(2000, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
             f"T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z")
        ),
        "time": lambda: f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
        f"{rng.randint(0, 59):02d}",
        "amount": lambda: rng.choice(
            (f"${rng.randint(1, 999)},{_d(rng, 3)},{_d(rng, 3)}.{_d(rng, 2)}",
             f"{rng.randint(1, 999)} {_d(rng, 3)} {_d(rng, 3)} EUR")
        ),
        "isbn": lambda: f"978-{rng.randint(0, 9)}-{_d(rng, 2)}-{_d(rng, 6)}-{rng.randint(0, 9)}",
        "sha": lambda: _token(rng, 40, "0123456789abcdef"),
        "hex colour": lambda: "#" + _token(rng, 6, "0123456789abcdef"),
        "coordinates": lambda: f"{rng.uniform(-90, 90):.4f}, {rng.uniform(-180, 180):.4f}",
        "code": lambda: rng.choice(
            ("std::vector<int>", "Foo::bar()", "a = b[1:2:3]", "sk-learn pipeline",
             "x@y", "user@localhost")
        ),
    }  # fmt: skip


_CLEAN = (
    "The build {} failed on the ARM runners, see the log.",
    "Ticket {} was closed as a duplicate.",
    "We shipped {} to every customer yesterday.",
    "Reference {} appears twice in the ledger.",
    "Can you summarise the thread about {} for me?",
    "Row 17 reads {} and row 18 is empty.",
)


def clean(rng: random.Random) -> Sample:
    misses = _near_misses(rng)
    variant = rng.choice(tuple(misses))
    return Sample(rng.choice(_CLEAN).format(misses[variant]()), None, variant=variant)


def corpus(seed: int, per_kind: int, clean_count: int) -> list[Sample]:
    rng = random.Random(seed)
    samples = [positive(rng, kind) for kind in GENERATORS for _ in range(per_kind)]
    samples.extend(clean(rng) for _ in range(clean_count))
    return samples


# --- the measurement ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Result:
    recall: dict[str, float]
    altered: float
    misses: list[Sample]
    false_alarms: list[tuple[Sample, tuple[Span, ...]]]


def _covered(spans: tuple[Span, ...], start: int, end: int) -> bool:
    at = start
    for span in spans:
        if span.start <= at < span.end:
            at = span.end
    return at >= end


async def measure(samples: list[Sample], checker: PiiChecker | None = None) -> Result:
    checker = checker or PiiChecker()
    found: Counter[str] = Counter()
    total: Counter[str] = Counter()
    misses: list[Sample] = []
    alarms: list[tuple[Sample, tuple[Span, ...]]] = []
    clean_count = 0
    for sample in samples:
        verdict = await checker.check(sample.text, Stage.INPUT)
        if sample.kind is None:
            clean_count += 1
            if verdict.spans:
                alarms.append((sample, verdict.spans))
            continue
        total[sample.kind] += 1
        if _covered(verdict.spans, sample.start, sample.end):
            found[sample.kind] += 1
        else:
            misses.append(sample)
    recall = {kind: found[kind] / total[kind] for kind in total}
    return Result(recall, len(alarms) / max(1, clean_count), misses, alarms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--per-kind", type=int, default=300)
    parser.add_argument("--clean", type=int, default=1500)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {seed}, {args.per_kind} positives per kind, {args.clean} clean samples")
    samples = corpus(seed, args.per_kind, args.clean)
    result = asyncio.run(measure(samples))
    for kind in GENERATORS:
        variants = Counter(sample.variant for sample in samples if sample.kind == kind)
        counts = ", ".join(f"{name} {count}" for name, count in sorted(variants.items()))
        print(f"{kind}: {counts}")
    near = Counter(sample.variant for sample in samples if sample.kind is None)
    print("clean: " + ", ".join(f"{name} {count}" for name, count in sorted(near.items())))
    for kind, value in result.recall.items():
        print(f"recall {kind:8} {value:.4f}")
    print(f"clean altered {result.altered:.4f} ({len(result.false_alarms)} of {args.clean})")
    for sample in result.misses[:20]:
        print("miss", sample.kind, sample.variant, repr(sample.text[sample.start : sample.end]))
    for sample, spans in result.false_alarms[:20]:
        print("alarm", sample.variant, repr(sample.text), [(s.kind, s.start, s.end) for s in spans])


if __name__ == "__main__":
    main()
