"""Budgets: a request's estimated cost is reserved before any model call, and settled
with what it really cost once it has ended.

A request falls under its tenant's budgets on all models and on its own model, each for
the period holding now in the policy's time zone. The estimate is its prompt plus its
output allowance at the highest prices among the deployments that may serve it, so a
request that fits its reservation can never take a budget past its amount: spend stays
within the budget whatever the concurrency, except by what an attempt costs beyond its
request's reservation (a hedge, a retry after a billed attempt, a prompt the provider
counts longer than the gateway's estimate). Refused, the caller gets 429 `budget_exceeded` with a
`Retry-After` to the end of the period that refused it.

While the store cannot decide, the policy's `when_down` applies: `fail_closed` refuses
(503), `fail_open` admits, and the spend of what it admitted is owed to the store and
paid as soon as it answers again, so the period's counter still ends complete.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from sluicegate.core.clock import Clock, sleep_until
from sluicegate.core.errors import GatewayError
from sluicegate.core.limits import StoreUnavailable
from sluicegate.core.refusals import Refusal
from sluicegate.core.spend import BudgetStore, Line, Unbuilt
from sluicegate.core.types import Budget, Period, SpendPolicy, WhenDown
from sluicegate.spend.periods import Window, window
from sluicegate.spend.prices import NANOS

log = logging.getLogger("sluicegate")

KEPT_AFTER_S = 7 * 86_400.0
"""How long a period's counter outlives the period in a shared store: settles of the
requests still running when it ended land there, and `/admin/status` reads it."""

AWAY_S = 0.5
"""How long budgets decide without the shared store once a call to it failed, before a
call tries it again: while it is away, no request waits for its timeout."""

MADE_KEPT = 10_000
"""Budget lines kept made at most: one per budget and period, so a few per budget."""

SpentRows = Callable[[str], Awaitable[Iterable[tuple[str, str, str, int]]]]
"""The durable record's (tenant, model, day, nanodollars) rows from a day on."""


@dataclass(frozen=True, slots=True)
class Hold:
    """What one request reserved, in which build of the store's counters, for its
    settlement (nothing, in no build, when admitted without the store)."""

    lines: tuple[Line, ...]
    nanos: int
    epoch: str


class Budgets:
    def __init__(
        self,
        policy: SpendPolicy,
        store: BudgetStore,
        wall: Clock,
        used: Callable[[Budget, float], None] = lambda budget, ratio: None,
    ) -> None:
        """`wall` reads unix seconds; `used` hears each budget's share used (spend and
        reservations over its amount) whenever its counter moves."""
        self._policy = policy
        self._store = store
        self._wall = wall
        self._zone = ZoneInfo(policy.time_zone)
        self._used = used
        self._of: dict[tuple[str, str], tuple[Budget, ...]] = {}
        self._windows: dict[Period, Window] = {}
        self._made: dict[tuple[Budget, str], Line] = {}
        self._warned: set[tuple[Budget, str]] = set()
        self._owed: dict[tuple[Line, str], tuple[int, int]] = {}
        """Per line and epoch, reservations and spend the store has not been told of."""
        self.rebuilding: asyncio.Task[None] | None = None
        self._away_until = 0.0
        """Until when the store is taken to be away (wall seconds)."""
        self._spent_rows: SpentRows | None = None

    def applying(self, tenant: str, model: str) -> tuple[Budget, ...]:
        """The budgets a request of `tenant` on `model` falls under, found once per pair."""
        found = self._of.get((tenant, model))
        if found is None:
            found = self._of[(tenant, model)] = tuple(
                b for b in self._policy.budgets if b.tenant == tenant and b.model in (None, model)
            )
        return found

    def window(self, period: Period, now_s: float) -> Window:
        """The period holding `now_s`, recomputed only once the last one asked has ended."""
        current = self._windows.get(period)
        if current is None or not current.start_s <= now_s < current.end_s:
            current = self._windows[period] = window(period, now_s, self._zone)
        return current

    def _lines(self, budgets: Sequence[Budget], now_s: float) -> tuple[Line, ...]:
        """The counters of `budgets` in their current periods, made once per period."""
        made = self._made
        lines = []
        for budget in budgets:
            current = self.window(budget.period, now_s)
            line = made.get((budget, current.name))
            if line is None:
                if len(made) > MADE_KEPT:
                    made.clear()
                line = made[(budget, current.name)] = self._line(budget, current)
            lines.append(line)
        return tuple(lines)

    @staticmethod
    def _line(budget: Budget, current: Window) -> Line:
        """Its key's parts are joined by `|`, which no name may hold (a tenant or model
        name may hold `:`), and `*`, which no model may be called, stands for all."""
        parts = (budget.tenant, budget.model or "*", budget.period.value, current.name)
        key = "spend:" + "|".join(parts)
        return Line(key, budget.amount_nanos, current.end_s + KEPT_AFTER_S)

    async def reserve(self, budgets: Sequence[Budget], nanos: int) -> Hold:
        """Reserve `nanos` on every budget in `budgets` at once, or refuse."""
        now = self._wall.now()
        lines = self._lines(budgets, now)
        if now < self._away_until:
            return self._without_store(lines, None)
        try:
            decision = await self._store.reserve(lines, nanos)
        except StoreUnavailable as exc:
            if not isinstance(exc, Unbuilt):
                self._away_until = self._wall.now() + AWAY_S
            return self._without_store(lines, exc)
        self._heard(budgets, lines, decision.totals, now)
        if decision.refused is None:
            return Hold(lines, nanos, decision.epoch)
        budget = budgets[decision.refused]
        raise exceeded(budget, nanos, self.window(budget.period, now), now)

    def _without_store(self, lines: tuple[Line, ...], exc: StoreUnavailable | None) -> Hold:
        if isinstance(exc, Unbuilt):
            self._start_rebuild()
        if self._policy.when_down is WhenDown.FAIL_OPEN:
            return Hold(lines, 0, "")
        raise Refusal.STORE_UNAVAILABLE.error(
            "the budget store is unavailable and budgets fail closed; retry later"
        )

    async def settle(self, hold: Hold, budgets: Sequence[Budget], spent: int) -> None:
        """Count what the request cost (`spent`) in place of its reservation."""
        if spent == hold.nanos:
            return
        if self._wall.now() < self._away_until:
            self.owe(hold.lines, spent, hold.nanos, hold.epoch)
            return
        try:
            totals = await self._store.settle(hold.lines, hold.nanos, spent, hold.epoch)
        except StoreUnavailable as exc:
            if not isinstance(exc, Unbuilt):
                self._away_until = self._wall.now() + AWAY_S
            self.owe(hold.lines, spent, hold.nanos, hold.epoch)
            return
        self._heard(budgets, hold.lines, totals, self._wall.now())

    def owe(self, lines: Sequence[Line], spent: int, reserved: int = 0, epoch: str = "") -> None:
        """Count `spent` in place of `reserved` (made in `epoch`) on `lines` at the next
        payment (`pay_owed`). The store takes a reservation back only in the build that
        holds it: after a loss of its counters, the whole spend is counted."""
        owed = self._owed
        for line in lines:
            was_reserved, was_spent = owed.get((line, epoch), (0, 0))
            owed[(line, epoch)] = (was_reserved + reserved, was_spent + spent)

    @property
    def owed(self) -> int:
        """Entries still to be told to the store."""
        return len(self._owed)

    async def pay_owed(self) -> None:
        """Count in the store what was spent while it could not be told."""
        while self._owed:
            (line, epoch), (reserved, spent) = next(iter(self._owed.items()))
            try:
                await self._store.settle((line,), reserved, spent, epoch)
            except StoreUnavailable:
                return
            now_owed = self._owed.pop((line, epoch))
            if now_owed != (reserved, spent):
                self._owed[(line, epoch)] = (now_owed[0] - reserved, now_owed[1] - spent)

    def _heard(
        self, budgets: Sequence[Budget], lines: Sequence[Line], totals: Sequence[int], now_s: float
    ) -> None:
        for budget, line, total in zip(budgets, lines, totals, strict=True):
            ratio = total / line.limit
            self._used(budget, ratio)
            if budget.soft is not None and ratio >= budget.soft:
                self._warn(budget, self.window(budget.period, now_s), ratio)

    def _warn(self, budget: Budget, current: Window, ratio: float) -> None:
        """One line per budget and period once its soft threshold is passed."""
        key = (budget, current.name)
        if key in self._warned:
            return
        self._warned = {k for k in self._warned if k[1] == current.name} | {key}
        log.warning(
            "tenant %s has used %.0f%% of its %s budget of $%g%s (period from %s)",
            budget.tenant,
            ratio * 100,
            budget.period.value,
            budget.amount_nanos / NANOS,
            "" if budget.model is None else f" on {budget.model}",
            current.name,
        )

    def attach_record(self, spent_rows: SpentRows) -> None:
        """The durable record counters are rebuilt from after the store lost them."""
        self._spent_rows = spent_rows

    def _start_rebuild(self) -> None:
        if self._spent_rows is None or (self.rebuilding and not self.rebuilding.done()):
            return
        self.rebuilding = asyncio.get_running_loop().create_task(self.rebuild())

    async def rebuild(self) -> None:
        """Set every budget's current counter to its period's spend in the durable record."""
        spent_rows = self._spent_rows
        if spent_rows is None or not self._policy.budgets:
            return
        now = self._wall.now()
        budgets = self._policy.budgets
        windows = [self.window(b.period, now) for b in budgets]
        try:
            rows = list(await spent_rows(min(w.name for w in windows)))
        except Exception as exc:
            log.warning("budget counters not rebuilt: the durable record is unreadable (%s)", exc)
            return
        totals: dict[Line, int] = {}
        for budget, current in zip(budgets, windows, strict=True):
            totals[self._line(budget, current)] = sum(
                nanos
                for tenant, model, day, nanos in rows
                if tenant == budget.tenant and budget.model in (None, model) and day >= current.name
            )
        try:
            if await self._store.rebuild(totals):
                log.warning("budget counters rebuilt from the durable record")
        except StoreUnavailable:
            return

    async def close(self) -> None:
        await self._store.close()

    async def run(self, every_s: float, clock: Clock) -> None:
        """Pay what is owed to the store, for the process's lifetime."""
        while True:
            await sleep_until(clock, clock.now() + every_s)
            await self.pay_owed()


def exceeded(budget: Budget, nanos: int, current: Window, now_s: float) -> GatewayError:
    """429 `budget_exceeded`, not to be retried before the period that refused it ends."""
    scope = "" if budget.model is None else f" on {budget.model}"
    error = Refusal.BUDGET.error(
        f"tenant {budget.tenant}'s {budget.period.value} budget of "
        f"${budget.amount_nanos / NANOS:g}{scope} has no room for this request "
        f"(reserving ${nanos / NANOS:.6f}); it renews at the period's end"
    )
    # The period's end is a time the gateway knows for certain, however far (a month):
    # not a peer's claim, so not held to the one-day ceiling of those.
    error.retry_after_s = max(1.0, math.ceil(current.end_s - now_s))
    error.should_retry = False
    return error
