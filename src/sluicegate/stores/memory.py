"""The embedded `LimitStore`: one process, no I/O, so every call completes without yielding."""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.core.clock import Clock
from sluicegate.core.limits import (
    Ask,
    GiveBack,
    Lease,
    Part,
    PrefillEnd,
    PrefillState,
    Rate,
    Refused,
    gcra,
    gcra_available,
    gcra_refund,
)
from sluicegate.core.prefill import PrefillBudget


class MemoryLimitStore:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._slots: dict[str, dict[str, float]] = {}
        """Per key: lease id -> when it lapses."""
        self._tats: dict[str, float] = {}
        self._cool_until: dict[str, float] = {}
        self._prefills: dict[str, PrefillBudget] = {}
        """A prompt stays counted until its end is reported: the process that counted it
        always reports it (`PoolPermit`, `Leases`, `FailoverStore` routing its end
        here), so it needs no lapse here."""

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        now = self._clock.now()
        cooldowns, slots, charges, _, prefill = ask
        if cooldowns and self._cool_until:
            for index, key in enumerate(cooldowns):
                left = self._cool_until.get(key, now) - now
                if left > 0:
                    return Refused(Part.COOLDOWN, index, left)
        held_by = self._slots
        for index, (key, limit) in enumerate(slots):
            held = held_by.get(key)
            if limit <= 0 or (held and len(held) >= limit and _sweep(held, now) >= limit):
                return Refused(Part.SLOT, index, None)
        tats: dict[str, float] = {}
        for index, (key, rate, cost) in enumerate(charges):
            tat = tats.get(key, self._tats.get(key, now))
            decision, tats[key] = gcra(tat, now, rate, cost)
            if not decision.allowed:
                return Refused(Part.CHARGE, index, decision.retry_after_s)
        if prefill is not None:
            budget = self._prefills.get(prefill.key)
            if budget is None:
                budget = self._prefills[prefill.key] = PrefillBudget(now)
            if not budget.admits(prefill.tokens, prefill.within_s, now):
                return Refused(Part.PREFILL, 0, budget.due_in_s(now))
        if tats:
            self._tats.update(tats)
        lease_id, keys = lease
        if prefill is not None:
            due_s = now + prefill.within_s if prefill.due else None
            self._prefills[prefill.key].sent(lease_id, prefill.tokens, due_s, now)
        until = now + ttl_s
        for key in keys:
            held = held_by.get(key)
            if held is None:
                held = held_by[key] = {}
            held[lease_id] = until
        return None

    async def renew(self, leases: Sequence[Lease], ttl_s: float) -> None:
        now = self._clock.now()
        for lease in leases:
            for key in lease.keys:
                held = self._slots.get(key)
                if held is not None and held.get(lease.id, now) > now:
                    held[lease.id] = now + ttl_s

    async def give_back(self, backs: Sequence[GiveBack]) -> None:
        now = self._clock.now()
        held_by, tats = self._slots, self._tats
        for (lease_id, keys), refunds in backs:
            freed = not keys
            for key in keys:
                held = held_by.get(key)
                if held is not None and held.pop(lease_id, now) > now:
                    freed = True
            if freed:
                for (key, rate, _), amount in refunds:
                    tats[key] = gcra_refund(tats.get(key, now), now, rate, amount)

    async def prefilled(self, ends: Sequence[PrefillEnd]) -> dict[str, PrefillState]:
        now = self._clock.now()
        states = {}
        for key, lease_id, first_token in ends:
            budget = self._prefills.get(key)
            if budget is None:
                continue
            if first_token:
                budget.first_token(lease_id, now)
            else:
                budget.dropped(lease_id)
            states[key] = PrefillState(budget.pending, budget.tokens_per_s)
        return states

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
