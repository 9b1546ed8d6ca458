"""A checker that asks a guard model (Llama Guard, for one) whether a text is safe.

The model is reached through an injected `ask(messages) -> answer text`, so the
guardrail framework decides how the call is made: through the gateway itself (a model
attempt with its own lane and pool, skipping guardrails) or straight to a backend. The
checker only shapes the conversation and reads the answer in Llama Guard's format: a
first line `safe` or `unsafe`, and after `unsafe` a line of category codes such as
`S1,S10`. Anything else raises, for the guardrail's failure mode to decide.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping

from sluicegate.guardrails.checker import PASSED, Stage, Verdict

Messages = list[dict[str, str]]
Ask = Callable[[Messages], Awaitable[str]]

LLAMA_GUARD_3 = {
    "S1": "violent_crimes", "S2": "non_violent_crimes", "S3": "sex_related_crimes",
    "S4": "child_sexual_exploitation", "S5": "defamation", "S6": "specialized_advice",
    "S7": "privacy", "S8": "intellectual_property", "S9": "indiscriminate_weapons",
    "S10": "hate", "S11": "suicide_and_self_harm", "S12": "sexual_content",
    "S13": "elections", "S14": "code_interpreter_abuse",
}  # fmt: skip
"""Llama Guard 3's hazard categories, by the code it answers with."""

MAX_ANSWER_CHARS = 1024
"""A verdict is two short lines; a longer answer is not one."""

_CODES = re.compile(r"S\d{1,3}(?:\s*,\s*S\d{1,3})*")


class GuardModelError(Exception):
    """The guard model answered something that is not a verdict."""


class GuardModelChecker:
    """Flags what the guard model calls unsafe, in a category of `block` (None: any)."""

    def __init__(
        self,
        ask: Ask,
        categories: Mapping[str, str] = LLAMA_GUARD_3,
        block: Iterable[str] | None = None,
        name: str = "guard_model",
    ) -> None:
        """`categories` names the codes; `block` holds codes or names."""
        self.name = name
        self._ask = ask
        self._categories = dict(categories)
        self._block = None if block is None else frozenset(block)
        known = set(self._categories) | set(self._categories.values())
        unknown = sorted((self._block or set()) - known)
        if unknown:
            raise ValueError(f"guard model block entries {unknown} are not category codes or names")

    async def check(self, text: str, stage: Stage) -> Verdict:
        answer = await self._ask(conversation(text, stage))
        codes = parse(answer)
        if codes is None:
            return PASSED
        named = tuple(self._categories.get(code, code) for code in codes) or ("unsafe",)
        blocked = self._block is None or any(
            code in self._block or self._categories.get(code) in self._block for code in codes
        )
        return Verdict(blocked, (), named)


def conversation(text: str, stage: Stage) -> Messages:
    """The text as the turn a guard model classifies: a prompt is the user's turn, an
    answer the assistant's (after an empty user turn, as chat templates want turns to
    alternate from the user's)."""
    if stage is Stage.INPUT:
        return [{"role": "user", "content": text}]
    return [{"role": "user", "content": ""}, {"role": "assistant", "content": text}]


def parse(answer: str) -> tuple[str, ...] | None:
    """None for `safe`; the category codes (maybe none) for `unsafe`."""
    if len(answer) > MAX_ANSWER_CHARS:
        raise GuardModelError(f"guard model answer is over {MAX_ANSWER_CHARS} characters")
    lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
    first = lines[0].lower() if lines else ""
    if first == "safe" and len(lines) == 1:
        return None
    if first != "unsafe" or len(lines) > 2:
        raise GuardModelError(f"guard model answer is not a verdict: {answer[:80]!r}")
    if len(lines) == 1:
        return ()
    if not _CODES.fullmatch(lines[1]):
        raise GuardModelError(f"guard model categories are not codes: {lines[1][:80]!r}")
    return tuple(code.strip() for code in lines[1].split(","))
