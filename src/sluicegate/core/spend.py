"""Spend's value types and the protocols of where it is kept: budget counters (a
shared store, or one process's memory) and the durable record.

A counter holds a budget period's spend and the reservations outstanding against it, in
nanodollars, under a key naming the tenant, the model (or `*`) and the period. A
reservation is all-or-nothing across a request's budgets: each counter plus the amount
stays within its limit, or nothing is added. Settling adds what the request really cost
less what it reserved (negative when it cost less), and may take a counter past its
limit: the provider billed it.

A shared store may lose its counters (a Redis restart); it then answers `Unbuilt` until
`rebuild` has set them again from the durable record, so that no budget is enforced on
counters that forgot the period's spend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from sluicegate.core.limits import StoreUnavailable


class Line(NamedTuple):
    key: str
    limit: int
    """Nanodollars."""
    expire_at_s: float
    """When the counter may be dropped (unix seconds): after its period's end, so late
    settles still land in it."""


class Decision(NamedTuple):
    refused: int | None
    """The index of the first line that had no room; None: reserved on every line."""
    totals: tuple[int, ...]
    """Each line's counter after the decision."""
    epoch: str
    """Which build of the counters decided: a settle in another build adds the whole
    cost, as the reservation it would take back was lost with its counters."""


class Unbuilt(StoreUnavailable):
    """The shared store lost its counters; they are rebuilt before budgets are enforced."""


class BudgetStore(Protocol):
    async def reserve(self, lines: Sequence[Line], nanos: int) -> Decision: ...

    async def settle(
        self, lines: Sequence[Line], reserved: int, spent: int, epoch: str
    ) -> tuple[int, ...]:
        """Count `spent` in place of `reserved` (made in `epoch`) on every line; their
        totals after."""
        ...

    async def rebuild(self, totals: Mapping[Line, int]) -> bool:
        """Set the counters from the durable record if they are still unbuilt; False when
        another replica did it first."""
        ...

    async def close(self) -> None: ...


RowKey = tuple[str, str, str]
"""(tenant, model, day) of the durable record."""


class Amounts(NamedTuple):
    nanos: int
    estimated_nanos: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    attempts: int


ZERO = Amounts(0, 0, 0, 0, 0, 0)


def added(a: Amounts, b: Amounts) -> Amounts:
    return Amounts(*(x + y for x, y in zip(a, b, strict=True)))


class SpendRecord(Protocol):
    async def add(self, rows: Mapping[RowKey, Amounts]) -> None: ...
