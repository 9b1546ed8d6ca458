"""Plug-in checkers for the pipeline's guardrail tests, named by path in their configs."""

from __future__ import annotations

import asyncio

from sluicegate.guardrails.checker import Stage, Verdict


class Never:
    """A checker that never answers: only its guardrail's budget ends the wait."""

    name = "never"

    async def check(self, text: str, stage: Stage) -> Verdict:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Counting:
    """Passes everything, counting the texts it was asked about."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    async def check(self, text: str, stage: Stage) -> Verdict:
        self.calls += 1
        return Verdict(False)
