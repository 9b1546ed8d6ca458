"""`GET /admin/spend` on a gateway in the test's loop, its record in SQLite: what the
book counted comes back per tenant, model and day, as JSON and CSV, to an admin only."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sluicegate.core.call import Bill
from sluicegate.spend.prices import Usage
from tests.support.inprocess import InProcessGateway, inprocess_gateway

ADMIN = "sk-admin"


def raw(tmp_path) -> dict:
    return {
        "admin": {"keys": [{"env": "ADMIN_KEY"}]},
        "jobs": {"sqlite_path": str(tmp_path / "jobs.db")},
        "spend": {"time_zone": "Asia/Tokyo"},
        "models": [
            {
                "name": "chat",
                "deployments": [
                    {
                        "name": "d",
                        "base_url": "http://127.0.0.1:9/v1",
                        "price": {"input": 2.0, "output": 8.0, "batch_discount": 0.5},
                    }
                ],
            }
        ],
        "tenants": [{"name": "alice", "keys": [{"env": "ALICE_KEY"}]}],
    }


@pytest.fixture
async def gateway(tmp_path) -> AsyncIterator[InProcessGateway]:
    env = {"ADMIN_KEY": ADMIN, "ALICE_KEY": "sk-alice"}
    async with inprocess_gateway(raw(tmp_path), env) as running:
        yield running


async def get(url: str, key: str = ADMIN) -> tuple[int, str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        return resp.status, resp.headers["content-type"], await resp.text()


async def test_the_route_returns_what_was_counted_as_json_and_csv(gateway):
    spend = gateway.runtime.pipeline.spend
    deployment = gateway.settings.models["chat"].deployments[0]
    spend.book.charge(Bill(), "alice", "chat", deployment, Usage(1000, 0, 100))
    spend.book.charge(Bill(discounted=True), "alice", "chat", deployment, Usage(1000, 0, 0))
    today = spend.book.today()
    status, kind, text = await get(f"{gateway.url}/admin/spend?from={today}")
    assert (status, kind) == (200, "application/json")
    answer = json.loads(text)
    assert answer["total_dollars"] == pytest.approx(0.0038)
    [row] = answer["data"]
    assert (row["day"], row["tenant"], row["model"], row["attempts"]) == (today, "alice", "chat", 2)
    status, kind, text = await get(f"{gateway.url}/admin/spend?from={today}&to={today}&format=csv")
    assert (status, kind) == (200, "text/csv; charset=utf-8")
    assert text.splitlines() == [
        "day,tenant,model,dollars,estimated_dollars,prompt_tokens,cached_tokens,output_tokens,attempts",
        f"{today},alice,chat,0.0038,0.0,2000,0,100,2",
    ]


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("", 200),
        ("?from=2026-13-01", 400),
        ("?from=2026-12-07&to=2026-12-01", 400),
        ("?from=2000-01-01&to=2026-01-01", 400),
        ("?format=xml", 400),
        ("?tenant=alice", 400),
    ],
)
async def test_bad_queries_are_refused_by_name(gateway, query, status):
    assert (await get(f"{gateway.url}/admin/spend{query}"))[0] == status


async def test_only_an_admin_reads_spend(gateway):
    assert (await get(f"{gateway.url}/admin/spend", key="sk-alice"))[0] == 401
