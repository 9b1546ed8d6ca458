"""The bounded hold-back of a checked stream: events wait here until their text has
passed, and at most `window` characters of text are ever held once a check is done.

Why that catches every match no longer than the window, however the events split it:
after each check everything but the last `window` characters has been released, so the
text still held starts at most `window` characters before the newest one. A match of
`n <= window` characters that ends in the newest text starts within the held text, so
the next check, on all the held text, sees it whole; one that ended earlier was seen by
an earlier check. Nothing leaves before a check has seen it.

Events keep their order. One without text (the role's opening, a finish, usage, the
end) leaves as soon as everything before it has; a text event leaves whole, as the bytes
that arrived, unless it had to be split at the window's edge or a mask changed it, in
which case its caller renders it again from its new texts. Only an event carrying
several texts (several choices' deltas in one event, which vLLM does not send) is never
split: it waits until it can leave whole, so behind it the client may be more than the
window behind.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sluicegate.guardrails.checker import Span, Verdict, mask


@dataclass(slots=True)
class Held:
    """One event: its bytes as they arrived, its parsed form (for rendering it again),
    and its texts as they stand now."""

    raw: bytes
    event: Any = None
    texts: list[str] = field(default_factory=list)
    changed: bool = False

    @property
    def size(self) -> int:
        return sum(len(text) for text in self.texts)


@dataclass(frozen=True, slots=True)
class Release:
    """What leaves: `texts` None for the event's own bytes, else these texts in it."""

    held: Held
    texts: list[str] | None = None


class HoldBack:
    __slots__ = ("_held", "_size", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self._held: deque[Held] = deque()
        self._size = 0

    @property
    def size(self) -> int:
        """Characters of text held."""
        return self._size

    def add(self, held: Held) -> None:
        self._held.append(held)
        self._size += held.size

    def text(self) -> str:
        """The held text, the checked text: every held event's texts in order."""
        return "".join(text for held in self._held for text in held.texts)

    def mask(self, verdict: Verdict) -> None:
        """Mask in the held texts what a check found (spans of `text()`): a span's mark
        goes in the event where it starts; its rest, in later events, is dropped."""
        start = 0
        for held in self._held:
            for index, text in enumerate(held.texts):
                end = start + len(text)
                masked = _masked(text, start, verdict.spans)
                if masked is not None:
                    held.texts[index] = masked
                    held.changed = True
                start = end
        self._size = sum(held.size for held in self._held)

    def release(self, *, everything: bool = False) -> list[Release]:
        """What may leave now: all but the last `window` characters of text (all, at the
        end of a stream), splitting the event at the edge when it carries one text; an
        event with no text leaves once all before it has."""
        out: list[Release] = []
        held = self._held
        free = self._size if everything else self._size - self.window
        while held:
            first = held[0]
            size = first.size
            if size <= max(free, 0):
                held.popleft()
                free -= size
                self._size -= size
                out.append(Release(first, first.texts if first.changed else None))
                continue
            if free > 0 and len(first.texts) == 1:
                text = first.texts[0]
                out.append(Release(first, [text[:free]]))
                first.texts = [text[free:]]
                first.changed = True
                self._size -= free
            break
        return out


def _masked(text: str, start: int, spans: tuple[Span, ...]) -> str | None:
    """`text` (at offset `start` of the held text) masked by `spans`; None if none
    touches it. A span begun before it covers its start: that part is cut."""
    end = start + len(text)
    cut = 0
    marked: list[Span] = []
    for span in spans:
        if span.start < end and span.end > start:
            if span.start < start:
                cut = max(cut, min(span.end, end) - start)
            else:
                marked.append(Span(span.start - start, min(span.end, end) - start, span.kind))
    if not cut and not marked:
        return None
    rest = [Span(max(s.start, cut) - cut, s.end - cut, s.kind) for s in marked if s.end > cut]
    return mask(text[cut:], rest)
