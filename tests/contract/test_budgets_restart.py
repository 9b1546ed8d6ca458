"""Budgets on a Redis of the test's own that is killed and started again empty: refused
or admitted as declared while it is away, rebuilt from the durable record before they
are enforced again, and what was spent meanwhile counted once it is back."""

import asyncio
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.core.spend import Amounts
from sluicegate.core.types import Budget, Period, SpendPolicy, WhenDown
from sluicegate.jobs.spend import SqlSpendRecord
from sluicegate.jobs.sqlite import open_sqlite
from sluicegate.spend.budgets import Budgets
from sluicegate.spend.prices import NANOS
from sluicegate.stores.budgets import RedisBudgetStore
from sluicegate.stores.resp import RespConnection
from tests.support.clock import FakeClock
from tests.support.redis import redis_server

DAILY = Budget("acme", 10 * NANOS, Period.DAILY)
NOW = datetime(2026, 12, 7, 12, tzinfo=ZoneInfo("UTC")).timestamp()


async def budgets_on(url: str, tmp_path, when_down: WhenDown):
    clock = FakeClock(NOW)
    jobs = await open_sqlite(tmp_path / "jobs.db", clock)
    record = SqlSpendRecord(jobs.database)
    store = RedisBudgetStore(RespConnection(url, 1.0), "t:", 1.0)
    heard: list[float] = []
    policy = SpendPolicy((DAILY,), when_down=when_down)
    subject = Budgets(policy, store, clock, lambda budget, ratio: heard.append(ratio))
    subject.attach_record(record.since)
    return subject, record, jobs, heard, clock


async def rebuilt(subject: Budgets) -> None:
    assert subject.rebuilding is not None
    await subject.rebuilding


async def test_fail_closed_refuses_until_the_counters_are_rebuilt(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        subject, record, jobs, heard, _ = await budgets_on(
            server.url, tmp_path, WhenDown.FAIL_CLOSED
        )
        try:
            await record.add({("acme", "chat", "2026-12-07"): Amounts(4 * NANOS, 0, 0, 0, 0, 1)})
            with pytest.raises(GatewayError) as refused:
                await subject.reserve((DAILY,), NANOS)
            assert (refused.value.status, refused.value.code) == (503, "limit_store_unavailable")
            await rebuilt(subject)
            await subject.reserve((DAILY,), NANOS)
            assert heard[-1] == 0.5, "the day's spend in the durable record, then this"
            server.kill()
            with pytest.raises(GatewayError):
                await subject.reserve((DAILY,), NANOS)
        finally:
            await subject.close()
            await jobs.close()


async def test_fail_open_counts_what_it_admitted_once_redis_is_back(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        subject, record, jobs, heard, clock = await budgets_on(
            server.url, tmp_path, WhenDown.FAIL_OPEN
        )
        try:
            await subject.rebuild()
            held = await subject.reserve((DAILY,), NANOS)
            server.kill()
            await subject.settle(held, (DAILY,), 2 * NANOS)
            admitted = await subject.reserve((DAILY,), NANOS)
            await subject.settle(admitted, (DAILY,), 3 * NANOS)
            await record.add({("acme", "chat", "2026-12-07"): Amounts(2 * NANOS, 0, 0, 0, 0, 1)})
            server.start()
            clock.t += 1.0  # past the time it is taken to be away
            await subject.pay_owed()
            assert subject.owed, "counters not rebuilt yet: nothing is paid into them"
            await subject.reserve((DAILY,), 0)
            await rebuilt(subject)
            await subject.pay_owed()
            assert not subject.owed
            await subject.reserve((DAILY,), 0)
            # Rebuilt at $2 from the record, then both requests' whole spend ($5), their
            # reservations having gone with the old counters: the $2 the record already
            # had is counted twice, which refuses early and never lets spend pass.
            assert heard[-1] == 0.7
        finally:
            await subject.close()
            await jobs.close()


async def test_a_redis_that_stops_answering_is_not_asked_again_at_once():
    """A server that takes every call and answers none (Redis stalled): the first call
    finds it silent, the next ones decide without it until it is tried again."""
    received = bytearray()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            received.extend(data)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clock = FakeClock(NOW)
    store = RedisBudgetStore(RespConnection(f"redis://127.0.0.1:{port}", 1.0), "t:", 0.2)
    subject = Budgets(SpendPolicy((DAILY,), when_down=WhenDown.FAIL_OPEN), store, clock)
    try:
        for _ in range(3):
            await subject.reserve((DAILY,), NANOS)
        await asyncio.sleep(0.05)
        assert received.count(b"EVALSHA") == 1
        clock.t += 0.5
        await subject.reserve((DAILY,), NANOS)
        await asyncio.sleep(0.05)
        assert received.count(b"EVALSHA") == 2
    finally:
        await subject.close()
        server.close()
