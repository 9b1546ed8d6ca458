"""Shared-limit state: the `LimitStore` protocol and the GCRA arithmetic every store uses.

Policy code talks to a `LimitStore`; the in-memory store serves one process, a
shared store (Redis) serves replicas. The algorithm is the same on each: a store
only decides where the state lives and where "now" comes from.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


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


class Slot(NamedTuple):
    """One concurrency slot under `key`, of at most `limit` held at once."""

    key: str
    limit: int


class Charge(NamedTuple):
    """`cost` units of `rate` under `key`."""

    key: str
    rate: Rate
    cost: float


def priced(charges: tuple[Charge, ...], which: tuple[int, ...], cost: float) -> tuple[Charge, ...]:
    """`charges` with those at `which` costing `cost`: a decision built once, whose token
    charges are priced per request with its reservation."""
    if not which:
        return charges
    each = list(charges)
    for index in which:
        key, rate, _ = each[index]
        each[index] = Charge(key, rate, cost)
    return tuple(each)


class Prefill(NamedTuple):
    """A streamed prompt of `tokens` sent to the deployment whose prefill budget is `key`
    (`core.prefill`), which must be prefilled, with those already waiting, within
    `within_s`: counted under the decision's lease id until its first token or its end
    (`PrefillEnd`). `due`: `within_s` is what the prompt's own promise has left (it
    waited), so it is due by then and holds later prompts that would make it late."""

    key: str
    tokens: int
    within_s: float
    due: bool = False


class Ask(NamedTuple):
    """One decision, all or nothing: none of `cooldowns` running, a slot under every
    limit, every charge within its rate, room in the `prefill` budget. A refusal writes
    nothing, except that an asker `queued` for these slots (it waits for them, having
    nowhere else to go) takes its place in their line where the store keeps one across
    replicas (`RedisLimitStore`)."""

    cooldowns: tuple[str, ...] = ()
    slots: tuple[Slot, ...] = ()
    charges: tuple[Charge, ...] = ()
    queued: bool = False
    prefill: Prefill | None = None


class Part(enum.StrEnum):
    COOLDOWN = "cooldown"
    SLOT = "slot"
    CHARGE = "charge"
    PREFILL = "prefill"


@dataclass(frozen=True, slots=True)
class Refused:
    """Which part of an `Ask` refused (`index` into that part's tuple), and when it
    may pass: a cooldown's end or a rate's next slot; None for a full slot. A slot free
    but set aside for another replica first in its line (`RedisLimitStore`) gives when
    that lapses, and the prefill budget when the earliest prompt due passes its due
    time: no promise either way (the replica may come, the limit may still hold)."""

    part: Part
    index: int
    retry_after_s: float | None


class Lease(NamedTuple):
    """The slots one decision took, held under one id until given back or, if its holder
    stops renewing it, until its time-to-live runs out."""

    id: str
    keys: tuple[str, ...]


NO_SLOTS = Lease("", ())
"""The lease of a decision that holds no slot (rates alone)."""


class Refund(NamedTuple):
    """`amount` units of a charge given back (negative: charged more)."""

    charge: Charge
    amount: float


class GiveBack(NamedTuple):
    """What one decision hands back when it ends: its lease's slots, and what its charges
    reserved but did not use."""

    lease: Lease
    refunds: tuple[Refund, ...] = ()


def unspent(
    charges: tuple[Charge, ...], which: tuple[int, ...], reserved: float, used: float | None
) -> tuple[Refund, ...]:
    """The refunds settling the charges at `which` (each priced at `reserved` by
    `priced`) against the usage reported: none while it is unknown (the reservation
    stands)."""
    if used is None or used == reserved:
        return ()
    return tuple([Refund(charges[index], reserved - used) for index in which])


class PrefillEnd(NamedTuple):
    """The prompt counted in the prefill budget `key` under lease `id` got its first
    token (the budget learns from it) or ended without one (it only stops counting)."""

    key: str
    id: str
    first_token: bool


class PrefillState(NamedTuple):
    """A prefill budget after some prompts ended: the prompt tokens still awaiting their
    first token, and the learnt throughput (None before any first token)."""

    pending: int
    tokens_per_s: float | None


class StoreUnavailable(Exception):
    """The limit store could not be reached or did not answer in time."""


class StoreTimeout(StoreUnavailable):
    """The limit store did not answer in time: it may yet have applied the call."""


class LimitStore(Protocol):
    """Slots, rate state and cooldowns under string keys, shared by whoever shares the
    store. Every method may raise `StoreUnavailable`."""

    async def take(self, ask: Ask, lease: Lease, ttl_s: float) -> Refused | None:
        """Decide `ask` at once, all or nothing: None when granted, the slots then held
        under `lease` (its id chosen by the caller, its keys those of `ask.slots`) until
        released or `ttl_s` without renewal."""
        ...

    async def renew(self, leases: Sequence[Lease], ttl_s: float) -> None:
        """Extend leases still held by `ttl_s` from now; a lapsed one stays lapsed."""
        ...

    async def give_back(self, backs: Sequence[GiveBack]) -> None:
        """Free each lease's slots and apply its refunds, all in one call. The refunds of a
        lease are applied by the give-back that frees it: giving it back twice, or after
        it lapsed, does nothing. A lease holding no slot cannot tell: its refunds are
        applied by every call that carries them."""
        ...

    async def prefilled(self, ends: Sequence[PrefillEnd]) -> dict[str, PrefillState]:
        """End each prompt's part of its prefill budget, all in one call; each budget's
        state after. A prompt no longer counted (ended already, or lapsed with its
        lease's time-to-live, unrenewed) is no error and teaches nothing."""
        ...

    async def cool(self, key: str, duration_s: float) -> None:
        """Refuse `key` for `duration_s` from now (extends, never shortens, a cooldown)."""
        ...

    async def in_use(self, key: str) -> int:
        """Slots held under `key` now."""
        ...

    async def available(self, key: str, rate: Rate) -> float:
        """Units of `rate` that could be charged under `key` now."""
        ...


_ALLOWED = RateDecision(True, 0.0)


def gcra(tat_s: float, now_s: float, rate: Rate, cost: float) -> tuple[RateDecision, float]:
    """Decide one request of `cost` units; returns the decision and the new theoretical
    arrival time (unchanged when refused). Run for every charge of every decision, so
    the interval is computed here rather than read through `Rate`'s properties."""
    burst = rate.burst
    if cost > burst:
        return RateDecision(False, float("inf")), tat_s
    interval = rate.period_s / rate.limit
    new_tat = (tat_s if tat_s > now_s else now_s) + interval * cost
    wait = new_tat - interval * burst - now_s
    if wait > 0:
        return RateDecision(False, wait), tat_s
    return _ALLOWED, new_tat


def gcra_refund(tat_s: float, now_s: float, rate: Rate, amount: float) -> float:
    """Give back `amount` units reserved but not used (negative: charge what was used beyond
    the reservation); idle time is not banked."""
    return max(tat_s - rate.interval_s * amount, now_s)


def gcra_available(tat_s: float, now_s: float, rate: Rate) -> float:
    """How many units could be admitted right now."""
    return min(rate.burst, (rate.tolerance_s - max(tat_s - now_s, 0.0)) / rate.interval_s)
