"""Every lease this process holds, kept alive by one heartbeat.

Lease ids are chosen here (this process's owner id and a counter), so that a lease
granted while its taker was cancelled can still be released. A lease lapses `ttl_s`
after it was last renewed, so the slots of a process that died
(even by SIGKILL) come free by themselves; a live process renews all of its leases
every `ttl_s / 3`, so a stream that lasts ten TTLs keeps its slots.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from sluicegate.core.clock import Clock, sleep_until
from sluicegate.core.errors import GatewayError
from sluicegate.core.limits import (
    NO_SLOTS,
    Ask,
    GiveBack,
    Lease,
    LimitStore,
    PrefillEnd,
    PrefillState,
    Refund,
    Refused,
    StoreUnavailable,
)
from sluicegate.core.refusals import Refusal

log = logging.getLogger("sluicegate")

LEASE_TTL_S = 30.0
_KEY = operator.itemgetter(0)
"""A slot's key (a lease's keys are those of its ask's slots)."""


class Leases:
    """The only way policy code takes and frees slots: it remembers what to renew."""

    def __init__(
        self,
        store: LimitStore,
        clock: Clock,
        ttl_s: float = LEASE_TTL_S,
        owner: str = "",
        *,
        detached: bool = False,
    ) -> None:
        """`detached` for a networked store: a request that ends does not wait a round
        trip for its give-backs. Those of one loop turn (a request's permits end together,
        and so may other requests') leave in one store call, made by a task whose first
        turn comes before any decision this process starts later, so the give-back is
        written first on the one connection; another replica sees it before a request the
        caller sends it after reading this answer (that request travels through the
        caller), in practice."""
        self.store = store
        self._detached = detached
        self._owner = owner or uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        self.ttl_s = ttl_s
        self.clock = clock
        self._held: set[Lease] = set()
        self._batch: list[GiveBack] | None = None
        """Give-backs handed over in this loop turn, sent together at the next."""
        self._finishing: set[asyncio.Future[None]] = set()
        self._ends: list[tuple[PrefillEnd, Callable[[PrefillState], None]]] | None = None
        """Prompts' prefill ends handed over in this loop turn, sent together at the next."""

    async def take(self, ask: Ask) -> Lease | Refused:
        """Decide `ask`. Cancelled while the store decides, the lease it may have granted
        (under the id chosen here) is given back, and the prompt it may have counted
        ended, by a task owned here. An ask for rates
        alone holds nothing: its lease is `NO_SLOTS`."""
        slots = ask.slots
        if not slots:
            refused = await self.store.take(ask, NO_SLOTS, self.ttl_s)
            return NO_SLOTS if refused is None else refused
        lease = Lease(f"{self._owner}:{next(self._ids)}", tuple(map(_KEY, slots)))
        try:
            refused = await self.store.take(ask, lease, self.ttl_s)
        except asyncio.CancelledError:
            self._hand_over(GiveBack(lease))
            if ask.prefill is not None:
                self.prefilled(PrefillEnd(ask.prefill.key, lease.id, False), unheard)
            raise
        if refused is None:
            self._held.add(lease)
            return lease
        return refused

    async def give_back(self, lease: Lease, refunds: tuple[Refund, ...] = ()) -> None:
        """Free a lease and apply its refunds, in one store call, whatever happens to the
        caller meanwhile: cut short by a cancellation, the call is made again by a task
        owned here (a lease with slots still applies its refunds once; those of
        `NO_SLOTS`, which no store can tell apart, may apply twice). With the store away,
        a lease lapses by its TTL and a refund is lost (the reservation stands): neither
        fails the request that ends. Detached, every give-back is left to such a task
        from the start."""
        self._held.discard(lease)
        if not lease.keys and not refunds:
            return
        back = GiveBack(lease, refunds)
        if self._detached:
            self._hand_over(back)
            return
        try:
            await self.store.give_back((back,))
        except StoreUnavailable:
            _lost()
        except asyncio.CancelledError:
            self._hand_over(back)
            raise

    def _hand_over(self, back: GiveBack) -> None:
        """Leave `back` to a task owned here, with every other handed over this loop turn."""
        batch = self._batch
        if batch is None:
            batch = self._batch = []
            self._own(self._send(batch))
        batch.append(back)

    async def _send(self, batch: list[GiveBack]) -> None:
        self._batch = None
        try:
            await self.store.give_back(batch)
        except StoreUnavailable:
            _lost()

    def prefilled(self, end: PrefillEnd, answered: Callable[[PrefillState], None]) -> None:
        """End a prompt's part of its prefill budget, from code that cannot wait (a first
        token seen mid-stream): left to a task owned here with every end of this loop
        turn, `answered` with the budget's state once the store has it. With the store
        away, a shared store's prompt lapses with its lease's TTL."""
        ends = self._ends
        if ends is None:
            ends = self._ends = []
            self._own(self._send_ends(ends))
        ends.append((end, answered))

    async def _send_ends(
        self, ends: list[tuple[PrefillEnd, Callable[[PrefillState], None]]]
    ) -> None:
        self._ends = None
        try:
            states = await self.store.prefilled([end for end, _ in ends])
        except StoreUnavailable:
            log.warning("the limit store is unavailable; a prompt's prefill lapses by its TTL")
            return
        for end, answered in ends:
            state = states.get(end.key)
            if state is not None:
                answered(state)

    def _own(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def drain(self, timeout_s: float) -> None:
        """Wait, up to `timeout_s`, for the give-backs handed to tasks: at shutdown, so
        that a stopping process frees what it held instead of leaving it to the TTL."""
        if self._finishing:
            await asyncio.wait(set(self._finishing), timeout=timeout_s)

    @property
    def held(self) -> int:
        return len(self._held)

    async def run(self) -> None:
        """Renew every held lease each third of the TTL, for the process's lifetime."""
        while True:
            await sleep_until(self.clock, self.clock.now() + self.ttl_s / 3)
            try:
                await self.store.renew(list(self._held), self.ttl_s)
            except StoreUnavailable:
                log.warning("the limit store is unavailable; leases not renewed this time")


def unheard(state: PrefillState) -> None:
    """A prompt that ended unprefilled taught nothing: its budget's state is not news."""


def store_unavailable() -> GatewayError:
    """The refusal for a decision the limit store could not make."""
    return Refusal.STORE_UNAVAILABLE.error("the limit store is unavailable")


def _lost() -> None:
    log.warning("the limit store is unavailable; a lease lapses by its TTL, a refund is lost")
