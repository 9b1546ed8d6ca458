"""The embedded `LimitStore`: one process, no I/O, so every call completes without yielding."""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.core.clock import Clock
from sluicegate.core.limits import (
    Ask,
    Charge,
    Lease,
    Part,
    Rate,
    Refused,
    gcra,
    gcra_available,
    gcra_refund,
)


class MemoryLimitStore:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._slots: dict[str, dict[str, float]] = {}
        """Per key: lease id -> when it lapses."""
        self._tats: dict[str, float] = {}
        self._cool_until: dict[str, float] = {}

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        now = self._clock.now()
        if ask.cooldowns and self._cool_until:
            for index, key in enumerate(ask.cooldowns):
                left = self._cool_until.get(key, now) - now
                if left > 0:
                    return Refused(Part.COOLDOWN, index, left)
        slots = self._slots
        if ask.slots:
            for index, slot in enumerate(ask.slots):
                held = slots.get(slot.key)
                if held and len(held) >= slot.limit and _sweep(held, now) >= slot.limit:
                    return Refused(Part.SLOT, index, None)
        if ask.charges:
            tats: dict[str, float] = {}
            for index, charge in enumerate(ask.charges):
                tat = tats.get(charge.key, self._tats.get(charge.key, now))
                decision, tats[charge.key] = gcra(tat, now, charge.rate, charge.cost)
                if not decision.allowed:
                    return Refused(Part.CHARGE, index, decision.retry_after_s)
            self._tats.update(tats)
        until = now + ttl_s
        for key in lease.keys:
            held = slots.get(key)
            if held is None:
                held = slots[key] = {}
            held[lease.id] = until
        return None

    async def renew(self, leases: Sequence[Lease], ttl_s: float) -> None:
        now = self._clock.now()
        for lease in leases:
            for key in lease.keys:
                held = self._slots.get(key)
                if held is not None and held.get(lease.id, now) > now:
                    held[lease.id] = now + ttl_s

    async def release(self, lease: Lease) -> None:
        for key in lease.keys:
            held = self._slots.get(key)
            if held is not None:
                held.pop(lease.id, None)

    async def refund(self, charge: Charge, amount: float) -> None:
        now = self._clock.now()
        tat = self._tats.get(charge.key, now)
        self._tats[charge.key] = gcra_refund(tat, now, charge.rate, amount)

    async def cool(self, key: str, duration_s: float) -> None:
        until = self._clock.now() + duration_s
        self._cool_until[key] = max(until, self._cool_until.get(key, until))

    async def in_use(self, key: str) -> int:
        held = self._slots.get(key)
        return 0 if not held else _sweep(held, self._clock.now())

    async def available(self, key: str, rate: Rate) -> float:
        now = self._clock.now()
        return gcra_available(self._tats.get(key, now), now, rate)


def _sweep(held: dict[str, float], now: float) -> int:
    """Drop the lapsed leases of one key (done only when they could matter: at its limit
    or when asked); the count left."""
    lapsed = [lease for lease, until in held.items() if until <= now]
    for lease in lapsed:
        del held[lease]
    return len(held)
