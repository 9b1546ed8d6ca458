"""`fallback`: the deployments in their configured order, a chain of ever less preferred ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.placement import Placed, Reason


class Fallback:
    name = "fallback"

    def order(self, targets: Sequence[Target], attempt: Attempt) -> tuple[list[Target], Placed]:
        return list(targets), Placed(targets[0].deployment.name, Reason.ORDER)

    def placed(self, attempt: Attempt, target: Target, placed: Placed) -> None:
        return None

    def view(self) -> dict[str, Any]:
        return {}
