"""The stream's hold-back: matches split across events are caught, nothing unchecked
leaves, and the client is never more than the window behind, by count."""

from __future__ import annotations

import random
import re

from sluicegate.guardrails.checker import Span, Verdict
from sluicegate.guardrails.holdback import Held, HoldBack

SECRET = re.compile(r"sk-[a-z]{8}")
"""A match 11 characters long."""


def found(text: str) -> Verdict:
    spans = tuple(Span(m.start(), m.end(), "key") for m in SECRET.finditer(text))
    return Verdict(bool(spans), spans)


def sent(releases) -> str:
    return "".join("".join(r.texts if r.texts is not None else r.held.texts) for r in releases)


def run(pieces: list[str], window: int) -> tuple[str, bool, list[int]]:
    """Feed `pieces` one event each, checking after each; what the client got, whether a
    match was caught, and how far behind the client was after each step."""
    hold = HoldBack(window)
    out, behind, total = "", [], 0
    for piece in pieces:
        hold.add(Held(piece.encode(), None, [piece]))
        total += len(piece)
        if found(hold.text()).flagged:
            return out, True, behind
        out += sent(hold.release())
        behind.append(total - len(out))
    out += sent(hold.release(everything=True))
    return out, False, behind


def test_a_match_split_across_events_is_caught_before_any_of_it_leaves() -> None:
    pieces = ["here is ", "the key s", "k-abc", "defgh and more"]
    out, caught, _ = run(pieces, window=11)
    assert caught
    assert "sk-" not in out
    assert "s" not in out[len("here is the key ") - 1 :]


def test_a_match_one_character_an_event_is_caught() -> None:
    text = "a" * 40 + "sk-abcdefgh" + "b" * 40
    out, caught, _ = run(list(text), window=11)
    assert caught
    assert out == "a" * len(out)
    assert "s" not in out


def test_random_splits_never_let_a_character_of_the_match_out() -> None:
    rng = random.Random(7)
    text = "x" * 200 + "sk-qwertyui" + "y" * 200
    start = text.index("sk-")
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 60)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        out, caught, _ = run(pieces, window=11)
        assert caught
        assert len(out) <= start


def test_the_client_is_never_more_than_the_window_behind() -> None:
    text = "lorem ipsum dolor sit amet " * 40
    rng = random.Random(3)
    pieces, at = [], 0
    while at < len(text):
        step = rng.randint(1, 9)
        pieces.append(text[at : at + step])
        at += step
    out, caught, behind = run(pieces, window=32)
    assert not caught
    assert out == text
    assert max(behind) == 32
    assert all(b <= 32 for b in behind)


def test_events_without_text_keep_their_place() -> None:
    hold = HoldBack(4)
    hold.add(Held(b"open", None, [""]))
    hold.add(Held(b"t1", None, ["abcdef"]))
    hold.add(Held(b"finish", None, []))
    first = hold.release()
    assert [r.held.raw for r in first] == [b"open", b"t1"]
    assert first[1].texts == ["ab"]
    rest = hold.release(everything=True)
    assert [(r.held.raw, r.texts) for r in rest] == [(b"t1", ["cdef"]), (b"finish", None)]


def test_an_untouched_event_leaves_as_its_own_bytes() -> None:
    hold = HoldBack(2)
    hold.add(Held(b"raw-1", None, ["abc"]))
    hold.add(Held(b"raw-2", None, ["de"]))
    released = hold.release()
    assert [(r.held.raw, r.texts) for r in released] == [(b"raw-1", None)]


def test_a_mask_rewrites_the_held_text_across_events() -> None:
    hold = HoldBack(20)
    for piece in ["my sk-ab", "cdefgh key"]:
        hold.add(Held(piece.encode(), None, [piece]))
    hold.mask(found(hold.text()))
    assert hold.text() == "my [KEY] key"
    assert hold.size == len(hold.text())


def test_an_event_without_text_leaves_before_the_window_fills() -> None:
    hold = HoldBack(32)
    hold.add(Held(b"open", None, [""]))
    hold.add(Held(b"t1", None, ["abc"]))
    assert [r.held.raw for r in hold.release()] == [b"open"]
