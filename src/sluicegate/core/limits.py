"""Shared-limit state: the `LimitStore` protocol and the GCRA arithmetic every store uses.

Policy code talks to a `LimitStore`; the in-memory store serves one process, a
shared store (Redis) serves replicas. The algorithm is the same on each: a store
only decides where the state lives and where "now" comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Rate:
    """`limit` units per `period_s`, at most `burst` of them at once (GCRA).

    The emission interval is period/limit; a cost may run ahead of the steady rate
    by at most `burst` units.
    """

    limit: float
    period_s: float
    burst: float

    @property
    def interval_s(self) -> float:
        return self.period_s / self.limit

    @property
    def tolerance_s(self) -> float:
        return self.interval_s * self.burst


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    retry_after_s: float
    """When refused: the wait until the same cost would be allowed (inf: never)."""


def gcra(tat_s: float, now_s: float, rate: Rate, cost: float) -> tuple[RateDecision, float]:
    """Decide one request of `cost` units; returns the decision and the new theoretical
    arrival time (unchanged when refused)."""
    if cost > rate.burst:
        return RateDecision(False, float("inf")), tat_s
    new_tat = max(tat_s, now_s) + rate.interval_s * cost
    wait = new_tat - rate.tolerance_s - now_s
    if wait > 0:
        return RateDecision(False, wait), tat_s
    return RateDecision(True, 0.0), new_tat


def gcra_refund(tat_s: float, now_s: float, rate: Rate, amount: float) -> float:
    """Give back `amount` units reserved but not used (negative: charge what was used beyond
    the reservation); idle time is not banked."""
    return max(tat_s - rate.interval_s * amount, now_s)


def gcra_available(tat_s: float, now_s: float, rate: Rate) -> float:
    """How many units could be admitted right now."""
    return min(rate.burst, (rate.tolerance_s - max(tat_s - now_s, 0.0)) / rate.interval_s)


class LimitStore(Protocol):
    """Counters, rate state and cooldowns under string keys."""

    async def acquire(self, key: str, limit: int) -> bool:
        """Take one of `limit` concurrency slots, or refuse at once."""
        ...

    async def release(self, key: str) -> None: ...

    async def in_use(self, key: str) -> int: ...

    async def consume(self, key: str, rate: Rate, cost: float) -> RateDecision: ...

    async def refund(self, key: str, rate: Rate, amount: float) -> None: ...

    async def available(self, key: str, rate: Rate) -> float: ...

    async def cool(self, key: str, duration_s: float) -> None:
        """Refuse `key` for `duration_s` from now (extends, never shortens, a cooldown)."""
        ...

    async def cooldown_left(self, key: str) -> float:
        """Seconds until the cooldown on `key` ends; 0 when not cooling."""
        ...
