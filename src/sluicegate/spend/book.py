"""The spend book: each billed attempt's cost, counted per tenant and model at once and
kept for the durable record until it is written.

Counting is in memory on the request path (a few dictionary updates); the durable
record is written off it, every flush interval, by `flush`. What a process killed
without warning loses is what it counted since its last flush: at most one flush
interval of its spend. The record's rows are per tenant, model and day.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from zoneinfo import ZoneInfo

from sluicegate.core.call import Bill
from sluicegate.core.clock import Clock, sleep_until
from sluicegate.core.spend import ZERO, Amounts, RowKey, SpendRecord, added
from sluicegate.core.types import Deployment, Model, SpendPolicy
from sluicegate.spend.periods import Days
from sluicegate.spend.prices import NANOS, Usage, cost_nanos

log = logging.getLogger("sluicegate")


class SpendBook:
    def __init__(
        self,
        policy: SpendPolicy,
        wall: Clock,
        counted: Callable[[str, str, float], None] = lambda tenant, model, dollars: None,
    ) -> None:
        """`wall` reads unix seconds (a spend's day); `counted` hears every cost in
        dollars, per tenant and model (the metric)."""
        self._wall = wall
        self.flush_s = policy.flush_s
        self._days = Days(ZoneInfo(policy.time_zone))
        self._counted = counted
        self._totals: dict[tuple[str, str], Amounts] = {}
        self._pending: dict[RowKey, Amounts] = {}
        self.flushes_failed = 0

    def charge(
        self, bill: Bill, tenant: str, model: str, deployment: Deployment, usage: Usage
    ) -> int:
        """Count one attempt `deployment` billed; what it cost in nanodollars."""
        price = deployment.price
        nanos = 0 if price is None else cost_nanos(price, usage, bill.discounted)
        bill.nanos += nanos
        bill.estimated = bill.estimated or usage.estimated
        amounts = Amounts(
            nanos,
            nanos if usage.estimated else 0,
            usage.prompt,
            usage.cached,
            usage.output,
            1,
        )
        pair = (tenant, model)
        self._totals[pair] = added(self._totals.get(pair, ZERO), amounts)
        row = (tenant, model, self._days.of(self._wall.now()))
        self._pending[row] = added(self._pending.get(row, ZERO), amounts)
        if nanos:
            self._counted(tenant, model, nanos / NANOS)
        return nanos

    def today(self) -> str:
        """The current day in the policy's time zone, ISO."""
        return self._days.of(self._wall.now())

    @property
    def pending(self) -> Mapping[RowKey, Amounts]:
        return self._pending

    async def flush(self, record: SpendRecord) -> None:
        """Write what was counted since the last flush; kept for the next on failure."""
        rows = self._pending
        if not rows:
            return
        self._pending = {}
        try:
            await record.add(rows)
        except BaseException:
            for key, amounts in rows.items():
                self._pending[key] = added(self._pending.get(key, ZERO), amounts)
            self.flushes_failed += 1
            raise

    async def run(
        self, record: SpendRecord, every_s: float, clock: Clock,
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> None:  # fmt: skip
        """Flush every `every_s` for the process's lifetime (`then` after each)."""
        while True:
            await sleep_until(clock, clock.now() + every_s)
            try:
                await self.flush(record)
            except Exception as exc:
                log.warning("spend not written to the durable record yet (%s); kept", exc)
            if then is not None:
                await then()

    def view(self, models: Mapping[str, Model]) -> dict[str, Any]:
        """This process's spend since it started, per tenant and model, in nanodollars
        (whole numbers, which the workers' documents add up exactly); and the
        deployments without a price, whose answers cost nothing (names joined by commas:
        one string, which the workers' documents agree on)."""
        tenants: dict[str, dict[str, Any]] = {}
        for (tenant, model), a in sorted(self._totals.items()):
            tenants.setdefault(tenant, {})[model] = {
                "nanos": a.nanos,
                "estimated_nanos": a.estimated_nanos,
                "prompt_tokens": a.prompt_tokens,
                "cached_tokens": a.cached_tokens,
                "output_tokens": a.output_tokens,
                "attempts": a.attempts,
            }
        unpriced = ", ".join(
            sorted(d.name for m in models.values() for d in m.deployments if d.price is None)
        )
        return {
            "tenants": tenants,
            "unpriced_deployments": unpriced,
            "pending_rows": len(self._pending),
        }
