"""Which of a model's deployments may take this attempt, and in what order?

The model's strategy (`placement`) orders them; deployments that already failed this
request are left out while another remains. The rest of a handed-over answer goes only
where a final assistant message is continued (one at least: its first part came from
such a deployment of this model). Once an attempt has gone, its strategy hears where,
and the count of each deployment chosen and why (its strategy's first choice, or a
fallback past it) is kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Model
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.placement import Placement, Reason
from sluicegate.scheduling.placement.fallback import Fallback
from sluicegate.scheduling.placement.least_loaded import LeastLoaded
from sluicegate.scheduling.placement.prefix_affinity import PrefixAffinity
from sluicegate.scheduling.placement.round_robin import RoundRobin
from sluicegate.scheduling.plugin import Dispatch, Quiet


def placement_for(model: Model, targets: Sequence[Target]) -> Placement:
    """The model's configured strategy."""
    if model.strategy == "fallback":
        return Fallback()
    if model.strategy == "least_loaded":
        return LeastLoaded()
    if model.strategy == "prefix_affinity":
        return PrefixAffinity(targets, model.prefix_affinity)
    return RoundRobin()


class Routing(Quiet):
    def __init__(self, targets: Sequence[Target], placement: Placement) -> None:
        self._targets = list(targets)
        self.placement = placement
        self.listening = len(self._targets) > 1
        self.chosen: Counter[tuple[str, Reason]] = Counter()
        """Attempts dispatched, by deployment and why it was chosen."""

    def candidates(self, attempt: Attempt) -> list[Target]:
        targets = self._targets
        if len(targets) == 1:
            return targets
        if attempt.call.resumed:
            targets = [target for target in targets if target.deployment.resumable]
        targets, attempt.placed = self.placement.order(targets, attempt)
        avoid = attempt.avoid
        if not avoid:
            return targets
        fresh = [t for t in targets if t.deployment.name not in avoid]
        return fresh or targets

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None:
        placed, target = attempt.placed, attempt.target
        if placed is None or target is None:
            return
        name = target.deployment.name
        self.chosen[(name, placed.reason if name == placed.first else Reason.FALLBACK)] += 1
        self.placement.placed(attempt, target, placed)

    def view(self) -> dict[str, Any]:
        chosen: dict[str, dict[str, int]] = {}
        for (name, reason), count in self.chosen.items():
            chosen.setdefault(name, {})[reason.value] = count
        return {"strategy": self.placement.name, "chosen": chosen, **self.placement.view()}


def most_telling(refusals: list[GatewayError]) -> GatewayError:
    """The refusal to answer with when no deployment took the attempt: when every one
    named a time, the soonest; otherwise one without a time, since the wait is then
    unknown."""
    untimed = [r for r in refusals if r.retry_after_s is None]
    if untimed:
        return untimed[0]
    return min(refusals, key=lambda r: r.retry_after_s or 0.0)
