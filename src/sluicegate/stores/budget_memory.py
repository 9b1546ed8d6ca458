"""One process's budget counters (`BudgetStore`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sluicegate.core.spend import Decision, Line


class MemoryBudgetStore:
    """One process's counters: never lost while the process lives, so never unbuilt.
    Counters of periods past are not dropped; a budget has one key per period, which is
    a few hundred bytes a tenant a year."""

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}

    async def reserve(self, lines: Sequence[Line], nanos: int) -> Decision:
        counters = self._counters
        totals = tuple(counters.get(line.key, 0) for line in lines)
        for index, (line, total) in enumerate(zip(lines, totals, strict=True)):
            if total + nanos > line.limit:
                return Decision(index, totals, "")
        for line in lines:
            counters[line.key] = counters.get(line.key, 0) + nanos
        return Decision(None, tuple(total + nanos for total in totals), "")

    async def settle(
        self, lines: Sequence[Line], reserved: int, spent: int, epoch: str
    ) -> tuple[int, ...]:
        counters = self._counters
        delta = spent - reserved
        for line in lines:
            counters[line.key] = counters.get(line.key, 0) + delta
        return tuple(counters[line.key] for line in lines)

    async def rebuild(self, totals: Mapping[Line, int]) -> bool:
        return False

    async def close(self) -> None:
        return None
