"""The one functional test every guardrail checker passes, called by each checker's tests.

`flagged` holds texts the checker must flag, `clean` texts it must let pass. Beyond
those two, every checker answers the same way twice, answers concurrent calls each on
its own text, keeps its spans inside the text, sorted and of a named kind, and answers
empty, unicode and large inputs without raising.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sluicegate.guardrails.checker import Checker, Stage, Verdict


def _well_formed(verdict: Verdict, text: str) -> None:
    assert isinstance(verdict, Verdict)
    starts = [span.start for span in verdict.spans]
    assert starts == sorted(starts)
    for span in verdict.spans:
        assert 0 <= span.start < span.end <= len(text), (span, len(text))
        assert span.kind
    if verdict.spans:
        assert verdict.flagged


async def check_contract(
    checker: Checker,
    flagged: Sequence[str],
    clean: Sequence[str],
    stage: Stage = Stage.INPUT,
) -> None:
    """Fails with the first text on which the checker breaks the interface's promises."""
    assert checker.name
    assert flagged
    assert clean
    for text in flagged:
        verdict = await checker.check(text, stage)
        assert verdict.flagged, text
        _well_formed(verdict, text)
        assert await checker.check(text, stage) == verdict, text
    for text in clean:
        verdict = await checker.check(text, stage)
        assert not verdict.flagged, (text, verdict)
    texts = [*flagged, *clean] * 4
    verdicts = await asyncio.gather(*(checker.check(text, stage) for text in texts))
    for text, verdict in zip(texts, verdicts, strict=True):
        assert verdict.flagged == (text in flagged), text
    large = clean[0] * (65536 // max(1, len(clean[0])))
    for odd in ("", "\u00e9\u00e8 \u4e2d\u6587 \U0001f600 \u200b", large):
        _well_formed(await checker.check(odd, stage), odd)
