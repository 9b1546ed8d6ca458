"""The durable record of spend, beside the jobs in their database: one row per tenant,
model and day (in the spend policy's time zone), added to in batches.

A batch is one transaction: all of it is counted or none, and a batch that failed is
offered again with the next. A batch whose commit succeeded but whose answer was lost
would be counted twice, which overstates spend and never loses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sluicegate.core.spend import Amounts, RowKey
from sluicegate.jobs.sql import Database, Row

_ADD = """INSERT INTO spend (tenant, model, day, nanos, estimated_nanos, prompt_tokens,
        cached_tokens, output_tokens, attempts)
    VALUES (:tenant, :model, :day, :nanos, :estimated, :prompt, :cached, :output, :attempts)
    ON CONFLICT (tenant, model, day) DO UPDATE SET
        nanos = spend.nanos + excluded.nanos,
        estimated_nanos = spend.estimated_nanos + excluded.estimated_nanos,
        prompt_tokens = spend.prompt_tokens + excluded.prompt_tokens,
        cached_tokens = spend.cached_tokens + excluded.cached_tokens,
        output_tokens = spend.output_tokens + excluded.output_tokens,
        attempts = spend.attempts + excluded.attempts"""

_BETWEEN = """SELECT tenant, model, day, nanos, estimated_nanos, prompt_tokens, cached_tokens,
        output_tokens, attempts
    FROM spend WHERE day >= :first AND day <= :last ORDER BY day, tenant, model"""


class SqlSpendRecord:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, rows: Mapping[RowKey, Amounts]) -> None:
        """Add every row's amounts, in one transaction."""
        async with self._db.write() as session:
            for (tenant, model, day), amounts in rows.items():
                nanos, estimated, prompt, cached, output, attempts = amounts
                await session.fetch(
                    _ADD,
                    {
                        "tenant": tenant,
                        "model": model,
                        "day": day,
                        "nanos": nanos,
                        "estimated": estimated,
                        "prompt": prompt,
                        "cached": cached,
                        "output": output,
                        "attempts": attempts,
                    },
                )

    async def between(self, first: str, last: str) -> Sequence[Row]:
        """Rows of the days from `first` to `last` (ISO dates, both included)."""
        async with self._db.read() as session:
            return await session.fetch(_BETWEEN, {"first": first, "last": last})

    async def since(self, first: str) -> list[tuple[str, str, str, int]]:
        """(tenant, model, day, nanodollars) from the day `first` on."""
        rows = await self.between(first, "9999-12-31")
        return [(r["tenant"], r["model"], r["day"], int(r["nanos"])) for r in rows]
