"""`round_robin`: each attempt starts one deployment further along the configured order."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.placement import Placed, Reason


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def order(self, targets: Sequence[Target], attempt: Attempt) -> tuple[list[Target], Placed]:
        start = next(self._turn) % len(targets)
        ordered = [*targets[start:], *targets[:start]]
        return ordered, Placed(ordered[0].deployment.name, Reason.ORDER)

    def placed(self, attempt: Attempt, target: Target, placed: Placed) -> None:
        return None

    def view(self) -> dict[str, Any]:
        return {}
