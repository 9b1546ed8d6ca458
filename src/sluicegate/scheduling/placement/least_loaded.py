"""`least_loaded`: the deployment with the most room per batch slot first (`load_of`).

Ties, as between idle replicas, go round in turn, so that equal replicas share the work
evenly rather than the first one taking every request of a quiet moment.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.placement import Placed, Reason, load_of


class LeastLoaded:
    name = "least_loaded"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def order(self, targets: Sequence[Target], attempt: Attempt) -> tuple[list[Target], Placed]:
        start = next(self._turn) % len(targets)
        rotated = [*targets[start:], *targets[:start]]
        ordered = sorted(rotated, key=load_of)
        return ordered, Placed(ordered[0].deployment.name, Reason.LEAST_LOADED)

    def placed(self, attempt: Attempt, target: Target, placed: Placed) -> None:
        return None

    def view(self) -> dict[str, Any]:
        return {}
