"""The guardrail around a checker: its time budget, failure mode, fallback and cache.

A checker only answers "which parts break my rule?". Whether a slow or broken checker
lets the request through (`fail_open`) or refuses it (`fail_closed`), how long it may
take, which checker stands in for it, and which recent verdicts can be reused are the
guardrail's, decided here once for every kind of checker. Every wait is on the clock
it is given.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sluicegate.core.clock import Clock, timeout_at
from sluicegate.core.errors import GatewayError
from sluicegate.core.guarding import Action, GuardrailSpec, OnFailure
from sluicegate.core.refusals import Refusal
from sluicegate.guardrails.cache import DecisionCache
from sluicegate.guardrails.checker import PASSED, Checker, Span, Stage, Verdict, mask


class Outcome(enum.StrEnum):
    """How one guardrail's decision ended; doubles as the metric label."""

    PASSED = "passed"
    FLAGGED = "flagged"
    FAILED_OPEN = "failed_open"
    FAILED_CLOSED = "failed_closed"


class Counts(Protocol):
    """What guardrails count (the gateway's metrics)."""

    def guardrail_decided(self, guardrail: str, outcome: str, took_s: float) -> None: ...

    def guardrail_timed_out(self, guardrail: str) -> None: ...

    def guardrail_cached(self, guardrail: str) -> None: ...


class Recorder(Counts, Protocol):
    """Where a guardrail reports what it decided, and why a check could not answer."""

    def guardrail_failed(self, guardrail: str, cause: str) -> None: ...


class NoRecorder:
    def guardrail_decided(self, guardrail: str, outcome: str, took_s: float) -> None:
        pass

    def guardrail_timed_out(self, guardrail: str) -> None:
        pass

    def guardrail_cached(self, guardrail: str) -> None:
        pass

    def guardrail_failed(self, guardrail: str, cause: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Decision:
    guardrail: str
    action: Action
    outcome: Outcome
    verdict: Verdict = PASSED

    def refusal(self, stage: Stage) -> GatewayError | None:
        """The error this decision ends the request with, if any. It names the guardrail
        and the categories found, never the text."""
        if self.outcome is Outcome.FAILED_CLOSED:
            return Refusal.GUARDRAIL_UNAVAILABLE.error(
                f"the guardrail {self.guardrail!r} could not check the {_whose(stage)} in "
                "time and fails closed; retry later"
            )
        if self.outcome is not Outcome.FLAGGED or self.action is Action.AUDIT:
            return None
        if self.action is Action.MASK and self.verdict.spans:
            return None
        found = ", ".join(self.verdict.categories or sorted({s.kind for s in self.verdict.spans}))
        return Refusal.GUARDRAIL_BLOCKED.error(
            f"the guardrail {self.guardrail!r} blocked the {_whose(stage)}"
            + (f" ({found})" if found else "")
        )

    def masked(self, text: str) -> str:
        """`text` with what a masking guardrail found replaced; else unchanged."""
        if self.action is Action.MASK and self.outcome is Outcome.FLAGGED:
            return mask(text, self.verdict.spans)
        return text


def _whose(stage: Stage) -> str:
    return "request" if stage is Stage.INPUT else "answer"


class Guardrail:
    """One configured guardrail: `check` always answers with a `Decision`, within the
    checker's budget plus, when it fails, the fallback's."""

    __slots__ = ("_cache", "_checker", "_clock", "_fallback", "_recorder", "spec")

    def __init__(
        self,
        spec: GuardrailSpec,
        checker: Checker,
        clock: Clock,
        cache: DecisionCache,
        fallback: Checker | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.spec = spec
        self._checker = checker
        self._fallback = fallback
        self._clock = clock
        self._cache = cache
        self._recorder: Recorder = recorder or NoRecorder()

    @property
    def name(self) -> str:
        return self.spec.name

    async def check(self, text: str, stage: Stage) -> Decision:
        started = self._clock.now()
        spec, cache = self.spec, self._cache
        key = cache.key(text, stage) if cache.on else None
        verdict = None if key is None else cache.get(key)
        if verdict is not None:
            self._recorder.guardrail_cached(spec.name)
        else:
            verdict = await self._ask(self._checker, spec.checker.budget_s, text, stage)
            if verdict is None and self._fallback is not None and spec.fallback is not None:
                verdict = await self._ask(self._fallback, spec.fallback.budget_s, text, stage)
            if verdict is not None and key is not None:
                cache.put(key, verdict)
        if verdict is None:
            failed = Outcome.FAILED_OPEN if spec.on_failure is OnFailure.OPEN else None
            outcome = failed or Outcome.FAILED_CLOSED
            verdict = PASSED
        else:
            outcome = Outcome.FLAGGED if verdict.flagged else Outcome.PASSED
        self._recorder.guardrail_decided(spec.name, outcome, self._clock.now() - started)
        return Decision(spec.name, spec.action, outcome, verdict)

    async def _ask(
        self, checker: Checker, budget_s: float, text: str, stage: Stage
    ) -> Verdict | None:
        """The checker's verdict, or None when it failed or ran out of time."""
        try:
            async with timeout_at(self._clock, self._clock.now() + budget_s):
                verdict = await checker.check(text, stage)
        except TimeoutError:
            self._recorder.guardrail_timed_out(self.spec.name)
            self._recorder.guardrail_failed(self.spec.name, f"{checker.name}: no answer in time")
            return None
        except Exception as exc:
            # The type only: a checker's message may quote the text it was given.
            self._recorder.guardrail_failed(self.spec.name, f"{checker.name}: {type(exc).__name__}")
            return None
        if isinstance(verdict, Verdict):
            return verdict
        self._recorder.guardrail_failed(self.spec.name, f"{checker.name}: not a Verdict")
        return None


async def screen(guardrails: Sequence[Guardrail], pieces: list[str], stage: Stage) -> list[str]:
    """Run `guardrails` in order over `pieces` (a request's texts, checked as one text
    joined by newlines); raise the first refusal, else return the pieces as the masking
    guardrails left them."""
    for guardrail in guardrails:
        joined = "\n".join(pieces)
        decision = await guardrail.check(joined, stage)
        refusal = decision.refusal(stage)
        if refusal is not None:
            raise refusal
        if decision.action is Action.MASK and decision.outcome is Outcome.FLAGGED:
            pieces = masked_pieces(pieces, decision.verdict)
    return pieces


def masked_pieces(pieces: list[str], verdict: Verdict) -> list[str]:
    """Each piece masked by the spans (found in the pieces joined by newlines) that fall
    in it; a span across pieces masks its part of each."""
    out: list[str] = []
    start = 0
    for piece in pieces:
        end = start + len(piece)
        spans = [
            Span(max(span.start, start) - start, min(span.end, end) - start, span.kind)
            for span in verdict.spans
            if span.start < end and span.end > start
        ]
        out.append(mask(piece, spans) if spans else piece)
        start = end + 1
    return out
