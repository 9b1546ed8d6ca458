"""Every lease this process holds, kept alive by one heartbeat.

Lease ids are chosen here (this process's owner id and a counter), so that a lease
granted while its taker was cancelled can still be released. A lease lapses `ttl_s`
after it was last renewed, so the slots of a process that died
(even by SIGKILL) come free by themselves; a live process renews all of its leases
every `ttl_s / 3`, so a stream that lasts ten TTLs keeps its slots.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import operator
import uuid
from collections.abc import Awaitable, Callable, Sequence

from sluicegate.core.clock import Clock, sleep_until
from sluicegate.core.errors import GatewayError
from sluicegate.core.limits import Ask, Charge, Lease, LimitStore, Refused, StoreUnavailable
from sluicegate.core.refusals import Refusal

log = logging.getLogger("sluicegate")

LEASE_TTL_S = 30.0
_NOTHING = Lease("", ())
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
        trip for its releases and refunds. Their task's first turn comes before any
        decision this process starts later, so the release is written first on the one
        connection; another replica sees it before a request the caller sends it after
        reading this answer (that request travels through the caller), in practice."""
        self.store = store
        self._detached = detached
        self._owner = owner or uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        self.ttl_s = ttl_s
        self._clock = clock
        self._held: set[Lease] = set()
        self._finishing: set[asyncio.Future[None]] = set()

    async def take(self, ask: Ask) -> Lease | Refused:
        """Decide `ask`. Cancelled while the store decides, the lease it may have granted
        (under the id chosen here) is released by a task owned here. An ask for rates
        alone holds nothing: its lease is an empty one."""
        slots = ask.slots
        if not slots:
            refused = await self.store.take(ask, _NOTHING, self.ttl_s)
            return _NOTHING if refused is None else refused
        lease = Lease(f"{self._owner}:{next(self._ids)}", tuple(map(_KEY, slots)))
        try:
            refused = await self.store.take(ask, lease, self.ttl_s)
        except asyncio.CancelledError:
            self._finish([functools.partial(self.store.release, lease)])
            raise
        if refused is None:
            self._held.add(lease)
            return lease
        return refused

    async def give_back(
        self, lease: Lease | None, refunds: Sequence[tuple[Charge, float]] = ()
    ) -> None:
        """Free a lease and refund charges, whatever happens to the caller meanwhile: a
        cancellation mid-way hands the remaining steps to a task owned here (the step
        cut short is done again; a release is idempotent). With the store away, a lease
        lapses by its TTL and a refund is lost (the reservation stands): neither fails
        the request that ends. Detached, every step runs in such a task from the start."""
        if lease is not None:
            self._held.discard(lease)
        releasing = lease is not None and lease.keys
        steps = [functools.partial(self.store.release, lease)] if releasing else []
        steps += [functools.partial(self.store.refund, c, amount) for c, amount in refunds]
        if self._detached:
            if steps:
                self._finish(steps)
            return
        for done, step in enumerate(steps):
            try:
                await step()
            except StoreUnavailable:
                _lost()
            except asyncio.CancelledError:
                self._finish(steps[done:])
                raise

    def _finish(self, steps: list[Callable[[], Awaitable[None]]]) -> None:
        async def rest() -> None:
            for step in steps:
                await _quietly(step())

        task = asyncio.ensure_future(rest())
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def drain(self, timeout_s: float) -> None:
        """Wait, up to `timeout_s`, for the steps handed to tasks: at shutdown, so that
        a stopping process frees what it held instead of leaving it to the TTL."""
        if self._finishing:
            await asyncio.wait(set(self._finishing), timeout=timeout_s)

    @property
    def held(self) -> int:
        return len(self._held)

    async def run(self) -> None:
        """Renew every held lease each third of the TTL, for the process's lifetime."""
        while True:
            await sleep_until(self._clock, self._clock.now() + self.ttl_s / 3)
            try:
                await self.store.renew(list(self._held), self.ttl_s)
            except StoreUnavailable:
                log.warning("the limit store is unavailable; leases not renewed this time")


async def _quietly(call: Awaitable[None]) -> None:
    try:
        await call
    except StoreUnavailable:
        _lost()


def store_unavailable() -> GatewayError:
    """The refusal for a decision the limit store could not make."""
    return Refusal.STORE_UNAVAILABLE.error("the limit store is unavailable")


def _lost() -> None:
    log.warning("the limit store is unavailable; a lease lapses by its TTL, a refund is lost")
