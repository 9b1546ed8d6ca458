"""Scripted guard-model verdicts, so tests can drive a guard-model checker end to end.

A model named with `--guard-model` answers a chat completion as Llama Guard does:
`safe`, or `unsafe` and a line of category codes when any message holds the marker
`[sim:unsafe]` or `[sim:unsafe S1,S10]` (S1 when no code is given).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MARKER = re.compile(r"\[sim:unsafe((?: S\d{1,3}(?:,S\d{1,3}){0,31})?)\]")


def verdict(texts: Iterable[str]) -> str:
    """The guard model's answer to a conversation of these message texts."""
    for text in texts:
        found = MARKER.search(text)
        if found is not None:
            return "unsafe\n" + (found.group(1).strip() or "S1")
    return "safe"
