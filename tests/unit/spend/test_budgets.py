"""Budgets on a fake clock that reads unix seconds (the wall clock budgets run on)."""

import logging
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Budget, Period, SpendPolicy
from sluicegate.spend.budgets import Budgets
from sluicegate.spend.prices import NANOS
from sluicegate.stores.budget_memory import MemoryBudgetStore
from tests.support.clock import FakeClock

UTC = ZoneInfo("UTC")
PARIS = ZoneInfo("Europe/Paris")
DOLLAR = NANOS


def at(zone: ZoneInfo, *parts: int) -> float:
    return datetime(*parts, tzinfo=zone).timestamp()


def budgets(clock: FakeClock, *given: Budget, zone: str = "UTC") -> tuple[Budgets, list]:
    heard: list[tuple[Budget, float]] = []
    policy = SpendPolicy(given, zone)
    found = Budgets(policy, MemoryBudgetStore(), clock, lambda b, r: heard.append((b, r)))
    return found, heard


async def test_a_reservation_is_settled_with_the_real_cost():
    clock = FakeClock(at(UTC, 2026, 12, 7, 12))
    daily = Budget("acme", DOLLAR, Period.DAILY)
    subject, heard = budgets(clock, daily)
    hold = await subject.reserve((daily,), 400_000_000)
    assert heard[-1] == (daily, 0.4)
    await subject.settle(hold, (daily,), 100_000_000)
    assert heard[-1] == (daily, 0.1)


async def test_over_budget_is_refused_with_retry_after_to_the_periods_end():
    clock = FakeClock(at(UTC, 2026, 12, 7, 18))
    daily = Budget("acme", DOLLAR, Period.DAILY)
    subject, _ = budgets(clock, daily)
    await subject.reserve((daily,), 900_000_000)
    with pytest.raises(GatewayError) as refused:
        await subject.reserve((daily,), 200_000_000)
    err = refused.value
    assert (err.status, err.code, err.should_retry) == (429, "budget_exceeded", False)
    assert err.retry_after_s == 6 * 3600


async def test_a_monthly_retry_after_is_not_cut_to_a_day():
    clock = FakeClock(at(UTC, 2026, 12, 7))
    monthly = Budget("acme", DOLLAR)
    subject, _ = budgets(clock, monthly)
    with pytest.raises(GatewayError) as refused:
        await subject.reserve((monthly,), 2 * DOLLAR)
    assert refused.value.retry_after_s == 25 * 86400


async def test_a_reservation_takes_every_budget_or_none():
    clock = FakeClock(at(UTC, 2026, 12, 7, 12))
    whole = Budget("acme", 10 * DOLLAR, Period.DAILY)
    on_model = Budget("acme", DOLLAR, Period.DAILY, model="big")
    subject, heard = budgets(clock, whole, on_model)
    applying = subject.applying("acme", "big")
    assert applying == (whole, on_model)
    assert subject.applying("acme", "small") == (whole,)
    with pytest.raises(GatewayError):
        await subject.reserve(applying, 2 * DOLLAR)
    await subject.reserve(applying, DOLLAR)
    assert heard[-2:] == [(whole, 0.1), (on_model, 1.0)]


async def test_a_new_month_in_the_budgets_zone_starts_afresh():
    # 22:30 UTC on 31 January is 23:30 in Paris: the month ends in half an hour there.
    clock = FakeClock(at(UTC, 2026, 1, 31, 22, 30))
    monthly = Budget("acme", DOLLAR)
    subject, _ = budgets(clock, monthly, zone="Europe/Paris")
    await subject.reserve((monthly,), DOLLAR)
    with pytest.raises(GatewayError) as refused:
        await subject.reserve((monthly,), 1)
    assert refused.value.retry_after_s == 1800
    clock.t += 1800
    await subject.reserve((monthly,), DOLLAR)


async def test_a_settle_after_the_period_ended_lands_in_the_period_it_reserved_in():
    clock = FakeClock(at(UTC, 2026, 12, 7, 23, 59))
    daily = Budget("acme", DOLLAR, Period.DAILY)
    subject, heard = budgets(clock, daily)
    hold = await subject.reserve((daily,), DOLLAR)
    clock.t += 120
    await subject.settle(hold, (daily,), DOLLAR // 2)
    assert heard[-1] == (daily, 0.5)
    await subject.reserve((daily,), DOLLAR)


async def test_the_soft_threshold_is_told_once_per_period(caplog):
    clock = FakeClock(at(UTC, 2026, 12, 7, 10))
    daily = Budget("acme", 10 * DOLLAR, Period.DAILY, soft=0.8)
    subject, _ = budgets(clock, daily)
    caplog.set_level(logging.WARNING, "sluicegate")
    await subject.reserve((daily,), 7 * DOLLAR)
    assert not caplog.records
    await subject.reserve((daily,), DOLLAR)
    await subject.reserve((daily,), DOLLAR)
    assert [r.getMessage() for r in caplog.records] == [
        "tenant acme has used 80% of its daily budget of $10 (period from 2026-12-07)"
    ]
    clock.t += 86400
    await subject.reserve((daily,), 9 * DOLLAR)
    assert len(caplog.records) == 2
    assert "period from 2026-12-08" in caplog.records[1].getMessage()


async def test_spend_owed_while_the_store_was_away_is_paid_later():
    clock = FakeClock(at(UTC, 2026, 12, 7, 10))
    daily = Budget("acme", 10 * DOLLAR, Period.DAILY)
    subject, heard = budgets(clock, daily)
    hold = await subject.reserve((daily,), DOLLAR)
    subject.owe(hold.lines, 3 * DOLLAR)
    assert subject.owed == 1
    await subject.pay_owed()
    assert subject.owed == 0
    await subject.settle(hold, (daily,), 0)
    assert heard[-1] == (daily, 0.3)


async def test_names_holding_colons_never_share_a_counter():
    clock = FakeClock(at(UTC, 2026, 12, 7, 12))
    one = Budget("a", DOLLAR, Period.DAILY, model="b:c")
    other = Budget("a:b", DOLLAR, Period.DAILY, model="c")
    subject, _ = budgets(clock, one, other)
    await subject.reserve((one,), DOLLAR)
    await subject.reserve((other,), DOLLAR)
