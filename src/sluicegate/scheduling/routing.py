"""Which of a model's deployments may take this attempt, and in what order?

`fallback` tries them in the configured order, `round_robin` rotates the first one per
attempt. Deployments that already failed this request go last. The rest of a
handed-over answer goes only where a final assistant message is continued (one at
least: its first part came from such a deployment of this model).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from sluicegate.core.errors import GatewayError
from sluicegate.scheduling.attempt import Attempt, Target


class Routing:
    def __init__(self, targets: Sequence[Target], chain: bool) -> None:
        self._targets = list(targets)
        self._chain = chain
        self._turn = itertools.count()

    def candidates(self, attempt: Attempt) -> list[Target]:
        targets = self._targets
        if len(targets) == 1:
            return targets
        if attempt.call.resumed:
            targets = [target for target in targets if target.deployment.resumable]
        if not self._chain:
            start = next(self._turn) % len(targets)
            targets = targets[start:] + targets[:start]
        avoid = attempt.avoid
        if not avoid:
            return targets
        fresh = [t for t in targets if t.deployment.name not in avoid]
        return fresh or targets


def most_telling(refusals: list[GatewayError]) -> GatewayError:
    """The refusal to answer with when no deployment took the attempt: when every one
    named a time, the soonest; otherwise one without a time, since the wait is then
    unknown."""
    untimed = [r for r in refusals if r.retry_after_s is None]
    if untimed:
        return untimed[0]
    return min(refusals, key=lambda r: r.retry_after_s or 0.0)
