"""The durable spend record on both databases of the job store."""

from sluicegate.core.spend import Amounts
from sluicegate.jobs.spend import SqlSpendRecord


async def test_batches_add_up_per_tenant_model_and_day(open_store):
    record = SqlSpendRecord((await open_store()).database)
    await record.add(
        {
            ("acme", "chat", "2026-12-06"): Amounts(5, 0, 10, 0, 2, 1),
            ("acme", "chat", "2026-12-07"): Amounts(7, 7, 10, 4, 3, 1),
        }
    )
    await record.add({("acme", "chat", "2026-12-07"): Amounts(3, 0, 1, 1, 1, 2)})
    rows = await record.between("2026-12-07", "2026-12-07")
    assert [
        (r["tenant"], r["model"], r["day"], r["nanos"], r["estimated_nanos"], r["attempts"])
        for r in rows
    ] == [("acme", "chat", "2026-12-07", 10, 7, 3)]
    assert await record.since("2026-12-06") == [
        ("acme", "chat", "2026-12-06", 5),
        ("acme", "chat", "2026-12-07", 10),
    ]


async def test_another_replica_adds_to_the_same_rows(open_store):
    first = SqlSpendRecord((await open_store()).database)
    second = SqlSpendRecord((await open_store()).database)
    await first.add({("t", "m", "2026-12-07"): Amounts(1, 0, 0, 0, 0, 1)})
    await second.add({("t", "m", "2026-12-07"): Amounts(2, 0, 0, 0, 0, 1)})
    assert await first.since("2026-12-01") == [("t", "m", "2026-12-07", 3)]
