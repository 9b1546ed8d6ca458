"""The embedded `LimitStore`: one process, no I/O, so every call completes without yielding."""

from __future__ import annotations

from sluicegate.core.clock import Clock
from sluicegate.core.limits import Rate, RateDecision, gcra, gcra_available, gcra_refund


class MemoryLimitStore:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._slots: dict[str, int] = {}
        self._tats: dict[str, float] = {}
        self._cool_until: dict[str, float] = {}

    async def acquire(self, key: str, limit: int) -> bool:
        used = self._slots.get(key, 0)
        if used >= limit:
            return False
        self._slots[key] = used + 1
        return True

    async def release(self, key: str) -> None:
        used = self._slots.get(key, 0)
        if used <= 0:
            raise RuntimeError(f"slot {key!r} released more often than acquired")
        self._slots[key] = used - 1

    async def in_use(self, key: str) -> int:
        return self._slots.get(key, 0)

    async def consume(self, key: str, rate: Rate, cost: float) -> RateDecision:
        now = self._clock.now()
        decision, self._tats[key] = gcra(self._tats.get(key, now), now, rate, cost)
        return decision

    async def refund(self, key: str, rate: Rate, amount: float) -> None:
        now = self._clock.now()
        self._tats[key] = gcra_refund(self._tats.get(key, now), now, rate, amount)

    async def available(self, key: str, rate: Rate) -> float:
        now = self._clock.now()
        return gcra_available(self._tats.get(key, now), now, rate)

    async def cool(self, key: str, duration_s: float) -> None:
        until = self._clock.now() + duration_s
        self._cool_until[key] = max(until, self._cool_until.get(key, until))

    async def cooldown_left(self, key: str) -> float:
        until = self._cool_until.get(key)
        return 0.0 if until is None else max(0.0, until - self._clock.now())
