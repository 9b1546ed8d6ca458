"""`GET /admin/spend`: spend per tenant, model and day over a range of days, as JSON or
CSV, read from the durable record (this process's unwritten spend is written first, so
what it counted is in the answer). Without a durable record (no `jobs:` section) it
reads this process's own book. For holders of an admin key only.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from datetime import date
from typing import Any
from urllib.parse import parse_qs

from sluicegate.api.asgi import Receive, Router, Scope, Send, send_bytes, send_error, send_json
from sluicegate.api.auth import key_digest, unauthorised
from sluicegate.core.errors import GatewayError, bad_request
from sluicegate.jobs.spend import SqlSpendRecord
from sluicegate.spend.gate import SpendGate
from sluicegate.spend.prices import NANOS

COLUMNS = (
    "day", "tenant", "model", "dollars", "estimated_dollars", "prompt_tokens",
    "cached_tokens", "output_tokens", "attempts",
)  # fmt: skip
MAX_DAYS = 3660
"""The longest range one answer covers (ten years)."""


class SpendRoutes:
    def __init__(self, spend: SpendGate | None, admin_keys: frozenset[bytes]) -> None:
        self._spend = spend
        self._admin_keys = admin_keys
        self._record: SqlSpendRecord | None = None

    def attach(self, record: SqlSpendRecord | None) -> None:
        self._record = record

    def routes(self, router: Router) -> Router:
        router.add("GET", "/admin/spend", self._spent)
        return router

    async def _spent(self, scope: Scope, receive: Receive, send: Send) -> None:
        if key_digest(scope) not in self._admin_keys:
            await send_error(send, unauthorised("an admin key is required"))
            return
        try:
            today = "" if self._spend is None else self._spend.book.today()
            first, last, form = _query(scope, today)
            rows = await self._rows(first, last)
        except GatewayError as err:
            await send_error(send, err)
            return
        if form == "csv":
            headers = [(b"content-type", b"text/csv; charset=utf-8")]
            await send_bytes(send, 200, _csv(rows).encode(), headers)
            return
        total = sum(row["dollars"] for row in rows)
        await send_json(
            send, 200, {"from": first, "to": last, "total_dollars": total, "data": rows}
        )

    async def _rows(self, first: str, last: str) -> list[dict[str, Any]]:
        spend = self._spend
        if spend is None:
            return []
        record = self._record
        if record is None:
            found: Iterable[Mapping[str, Any]] = [
                {"tenant": t, "model": m, "day": d, **a._asdict()}
                for (t, m, d), a in spend.book.pending.items()
                if first <= d <= last
            ]
        else:
            await spend.book.flush(record)
            found = await record.between(first, last)
        return [_shown(row) for row in found]


def _shown(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "day": row["day"],
        "tenant": row["tenant"],
        "model": row["model"],
        "dollars": int(row["nanos"]) / NANOS,
        "estimated_dollars": int(row["estimated_nanos"]) / NANOS,
        "prompt_tokens": int(row["prompt_tokens"]),
        "cached_tokens": int(row["cached_tokens"]),
        "output_tokens": int(row["output_tokens"]),
        "attempts": int(row["attempts"]),
    }


def _query(scope: Scope, today: str) -> tuple[str, str, str]:
    """`from` and `to` (ISO days, both included; default `today`) and `format`."""
    query = parse_qs(scope["query_string"].decode("latin-1"))
    unknown = sorted(query.keys() - {"from", "to", "format"})
    if unknown:
        raise bad_request(f"unknown query parameter {unknown[0]!r}")
    first = _day(query.get("from", [today or date.today().isoformat()])[-1], "from")
    last = _day(query.get("to", [first])[-1], "to")
    if last < first or (date.fromisoformat(last) - date.fromisoformat(first)).days > MAX_DAYS:
        raise bad_request(f"'to' must be a day from 'from' to {MAX_DAYS} days after it")
    form = query.get("format", ["json"])[-1]
    if form not in ("json", "csv"):
        raise bad_request("'format' is json or csv", param="format")
    return first, last, form


def _day(text: str, name: str) -> str:
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise bad_request(f"{name!r} must be a day as YYYY-MM-DD", param=name) from None


def _csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
