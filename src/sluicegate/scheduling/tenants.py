"""What does each tenant hold and what was it served? The counts a lane's fairness reads.

A tenant holds a request from the moment a deployment is taken for it, before the
dispatcher's first await, so that a request judged while this one waits for the limit
store sees it (`share.WithinShare`). It is charged the work it asked as it goes out, the
rest of an answer its output alone (its prompt was charged when it first went), and the
estimate is corrected by what the answer produced when it ends. The check never refuses:
it only counts, and undoes what it counted with the dispatcher's one loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.fairness import Fairness
from sluicegate.scheduling.plugin import Dispatch, NotNow, Quiet


class Tenants(Quiet):
    name = "tenants"
    lane_wide = True
    holds_rests = False

    def __init__(self, fairness: Mapping[str, Fairness]) -> None:
        self._fairness = fairness
        """Each lane's fairness, by lane name."""
        self._charged: dict[int, int] = {}
        """Per attempt out, the output tokens its tenant was charged ahead."""

    def applies(self, target: Target, lane: Lane) -> bool:
        return True

    def check(self, target: Target, lane: Lane) -> NotNow | None:
        return None

    def taken(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        self._fairness[lane.name].in_flight(attempt.call.tenant.name, 1)

    def withdrawn(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        self._fairness[lane.name].in_flight(attempt.call.tenant.name, -1)

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None:
        call = attempt.call
        output = call.reserved_tokens - call.prompt_tokens
        self._charged[id(attempt)] = output
        prompt = 0 if call.resumed else call.prompt_tokens
        self._fairness[attempt.lane.name].charge(call.tenant.name, prompt, output)

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        fairness, tenant = self._fairness[lane.name], attempt.call.tenant.name
        fairness.in_flight(tenant, -1)
        charged = self._charged.pop(id(attempt))
        produced = attempt.produced()
        if produced is not None:
            fairness.charge(tenant, 0, produced - charged)

    def view(self) -> Mapping[str, int]:
        return {"charged_ahead": len(self._charged)}
