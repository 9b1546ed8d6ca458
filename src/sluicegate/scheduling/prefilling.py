"""The prefill budget as one dispatcher sees it: how much may a deployment prefill at once?

With a promise on the top lane, the streamed prompts waiting at a deployment for their
first token may together take at most `PREFILL_PART` of that promise to prefill
(`core.prefill`). The budget itself lives in the limit store, decided with the pools
(`Ask.prefill`), one for every replica sending to the deployment; this plug-in asks for
each streamed attempt's part, counts this replica's prompts until their first token,
and hears the throughput the budget learnt. Without a promise, or `budgeted` off, there
is no budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.core import keys
from sluicegate.core.clock import Clock
from sluicegate.core.limits import Prefill, PrefillState
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.plugin import Dispatch, Quiet

PREFILL_PART = 0.5
"""The part of the top lane's promise the prompts waiting at a deployment for their
first token may take to prefill together: the rest is for the wait in the queue and the
engine step the first token comes in."""


@dataclass(slots=True)
class _Budget:
    key: str
    pending: int = 0
    """This dispatcher's streamed prompt tokens sent and not yet at their first token."""
    tokens_per_s: float | None = None
    """The budget's learnt throughput, as last heard."""
    prompts: int = 0
    """Prompt tokens that got their first token from this dispatcher so far: those a
    stream's span held cost part of its steps (`demand.EngineUnit.streamed`)."""

    def heard(self, state: PrefillState) -> None:
        self.tokens_per_s = state.tokens_per_s


@dataclass(frozen=True, slots=True)
class BudgetView:
    pending_tokens: int
    tokens_per_s: float | None


class PrefillBudgets(Quiet):
    def __init__(
        self,
        lanes: Sequence[Lane],
        targets: Sequence[Target],
        clock: Clock,
        budgeted: bool = True,
    ) -> None:
        promise = max(lanes, key=lambda lane: lane.priority).ttft_slo_s if budgeted else None
        self._within_s = None if promise is None else PREFILL_PART * promise
        names = [] if promise is None else [target.deployment.name for target in targets]
        self._budgets = {name: _Budget(keys.prefill(name)) for name in names}
        self._clock = clock
        self._seen: dict[int, int] = {}
        """Per attempt past its first token, its deployment's prompt tokens prefilled then:
        what the engine prefilled since took part of the steps its answer decoded in."""
        self.listening = bool(self._budgets)
        """Without a budget, no prompt is counted."""

    def ask(self, attempt: Attempt, target: Target) -> Prefill | None:
        """A streamed `attempt`'s part in `target`'s budget: its prompt, to be prefilled
        with those waiting within the budget's part of the promise, or, due by then,
        within what its own promise has left since it arrived if less (the rest of an
        answer has its first token: no promise is left to keep)."""
        call, part_s = attempt.call, self._within_s
        if part_s is None or not call.stream:
            return None
        key, promise = self._budgets[target.deployment.name].key, attempt.lane.ttft_slo_s
        if promise is not None and not call.resumed:
            left_s = promise - (self._clock.now() - call.arrived_s)
            if left_s < part_s:
                return Prefill(key, call.prompt_tokens, left_s, due=True)
        return Prefill(key, call.prompt_tokens, part_s)

    def rates(self) -> list[float]:
        """The deployments' learnt prefill rates, as last heard, where learnt."""
        return [rate for budget in self._budgets.values() if (rate := budget.tokens_per_s)]

    def rate(self, target: Target) -> float | None:
        budget = self._budgets.get(target.deployment.name)
        return None if budget is None else budget.tokens_per_s

    def prompts_meanwhile(self, attempt: Attempt, target: Target) -> int | None:
        """The prompt tokens `target` prefilled between `attempt`'s first token and now:
        0 without a budget (nothing counted, nothing to take), None when its first token
        was not counted, so its span cannot be split and teaches nothing."""
        budget = self._budgets.get(target.deployment.name)
        if budget is None:
            return 0
        seen = self._seen.get(id(attempt))
        return None if seen is None else budget.prompts - seen

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None:
        budget = self._counting(attempt)
        if budget is not None:
            budget.pending += attempt.call.prompt_tokens

    def first_token(self, attempt: Attempt, ttft_s: float) -> None:
        """The prompt is prefilled: it leaves the budget, which learns from its time unless
        it is the rest of an answer (prefilled with the answer so far too)."""
        budget = self._counting(attempt)
        if budget is None:
            return
        call = attempt.call
        budget.pending -= call.prompt_tokens
        if not call.resumed:
            budget.prompts += call.prompt_tokens
        self._seen[id(attempt)] = budget.prompts
        assert attempt.permit is not None
        attempt.permit.first_token(budget.heard, learn=not call.resumed)

    def ended(self, attempt: Attempt) -> None:
        self._seen.pop(id(attempt), None)
        budget = self._counting(attempt)
        if budget is not None:
            budget.pending -= attempt.call.prompt_tokens

    def _counting(self, attempt: Attempt) -> _Budget | None:
        """The budget `attempt`'s prompt still counts in, if any."""
        target, permit = attempt.target, attempt.permit
        if target is None or permit is None or permit.prefilling is None:
            return None
        return self._budgets[target.deployment.name]

    def view(self, target: Target) -> BudgetView | None:
        budget = self._budgets.get(target.deployment.name)
        return None if budget is None else BudgetView(budget.pending, budget.tokens_per_s)
