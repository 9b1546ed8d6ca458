"""The guard-model checker on a scripted `ask`: the conversation it sends, the verdicts
it reads, and the answers it refuses."""

from __future__ import annotations

import pytest

from sluicegate.guardrails.checker import Stage
from sluicegate.guardrails.guardmodel import (
    MAX_ANSWER_CHARS,
    GuardModelChecker,
    GuardModelError,
    Messages,
    conversation,
    parse,
)
from tests.unit.guardrails.contract import check_contract


class Scripted:
    """Answers `unsafe` with the codes after "bad:" in the last message, else `safe`."""

    def __init__(self) -> None:
        self.asked: list[Messages] = []

    async def __call__(self, messages: Messages) -> str:
        self.asked.append(messages)
        text = messages[-1]["content"]
        return f"unsafe\n{text.split('bad:')[1].strip()}" if "bad:" in text else "safe"


async def test_the_guard_model_checker_keeps_the_checkers_promises() -> None:
    await check_contract(GuardModelChecker(Scripted()), ["bad: S1", "x bad: S2,S10"], ["fine"])


async def test_a_prompt_is_the_users_turn_and_an_answer_the_assistants() -> None:
    ask = Scripted()
    checker = GuardModelChecker(ask)
    await checker.check("hello", Stage.INPUT)
    await checker.check("hi back", Stage.OUTPUT)
    assert ask.asked == [
        [{"role": "user", "content": "hello"}],
        [{"role": "user", "content": ""}, {"role": "assistant", "content": "hi back"}],
    ]
    assert conversation("hello", Stage.INPUT) == ask.asked[0]


async def test_unsafe_categories_are_named_and_only_blocked_ones_flag() -> None:
    checker = GuardModelChecker(Scripted(), block=["S1", "hate"])
    assert (await checker.check("bad: S10", Stage.INPUT)).categories == ("hate",)
    assert (await checker.check("bad: S10", Stage.INPUT)).flagged
    audited = await checker.check("bad: S7,S99", Stage.INPUT)  # S99: unknown, named as is
    assert (audited.flagged, audited.categories) == (False, ("privacy", "S99"))


@pytest.mark.parametrize(
    ("answer", "codes"),
    [("safe", None), (" Safe \n", None), ("unsafe", ()), ("unsafe\nS1", ("S1",)),
     ("unsafe\nS1, S10", ("S1", "S10"))],
)  # fmt: skip
def test_verdicts_in_llama_guards_format_are_read(answer: str, codes) -> None:
    assert parse(answer) == codes


@pytest.mark.parametrize(
    "answer",
    ["", "I cannot help with that", "safe\nS1", "unsafe\nviolence", "unsafe\nS1\nmore",
     "safe" + " " * MAX_ANSWER_CHARS],
)  # fmt: skip
def test_anything_else_raises(answer: str) -> None:
    with pytest.raises(GuardModelError):
        parse(answer)


def test_a_block_entry_that_names_no_category_is_refused() -> None:
    with pytest.raises(ValueError, match="'violence'"):
        GuardModelChecker(Scripted(), block=["S1", "violence"])
