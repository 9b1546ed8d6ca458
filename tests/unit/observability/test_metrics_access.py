"""Who may read `/metrics` and what it shows: a bearer token when one is configured, the
tenant-labelled families only when allowed, and a merged page built at most once per
cache period however many scrapers ask."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import orjson

from sluicegate.api.apart import apart
from sluicegate.api.asgi import Router
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.observability.siblings import Seat
from tests.unit.test_pipeline import config, running

TOKEN = "scraper-token"


async def get(app, path: str, headers=(), port: int = 8000) -> tuple[int, bytes]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "headers": list(headers),
        "server": ("127.0.0.1", port),
    }
    await app(scope, None, send)
    return sent[0]["status"], sent[1]["body"]


async def test_a_configured_token_is_needed_to_read_the_metrics():
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    async with running(config({"name": "a"}, metrics={"keys": [{"sha256": digest}]}), {}) as h:
        app = h.runtime.app
        assert (await get(app, "/metrics"))[0] == 401
        wrong = [(b"authorization", b"Bearer sk-a")]
        assert (await get(app, "/metrics", wrong))[0] == 401
        status, body = await get(app, "/metrics", [(b"authorization", f"Bearer {TOKEN}".encode())])
        assert status == 200
        assert b"sluicegate_requests_in_flight" in body


def test_without_tenant_labels_no_family_names_a_tenant():
    metrics = GatewayMetrics(tenant_labels=False)
    metrics.judged("chat", "m", "default", "acme-corp", "met", "met")
    page = metrics.exposition()
    assert b"acme-corp" not in page
    assert b"tenant=" not in page
    assert b"sluicegate_request_outcomes_total" in page
    shown = GatewayMetrics()
    shown.judged("chat", "m", "default", "acme-corp", "met", "met")
    assert b'tenant="acme-corp"' in shown.exposition()


async def test_a_metrics_address_of_its_own_serves_only_the_metrics():
    async def api(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"api"})

    metrics = Router()

    async def page(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"page"})

    metrics.add("GET", "/metrics", page)
    app = apart(api, metrics, 9464)
    assert await get(app, "/metrics", port=9464) == (200, b"page")
    assert (await get(app, "/v1/models", port=9464))[0] == 404
    assert await get(app, "/v1/models", port=8000) == (200, b"api")


async def test_the_api_address_has_no_metrics_when_they_have_their_own():
    raw = config({"name": "a"}, metrics={"host": "127.0.0.1", "port": 9464})
    async with running(raw, {}) as h:
        assert (await get(h.runtime.app, "/metrics", port=8000))[0] == 404
        assert (await get(h.runtime.app, "/metrics", port=9464))[0] == 200


class SlowSiblings:
    """Siblings that take 5 ms to answer, as workers over their sockets do."""

    seat = Seat(0, 2, Path("/nonexistent"))

    async def ask(self, kind: str) -> dict[int, object]:
        await asyncio.sleep(0.005)
        return {1: orjson.loads(GatewayMetrics().samples())}


async def test_sixteen_scrapers_every_10ms_build_the_merged_page_once_per_cache_period():
    cache_s, run_s = 0.1, 0.6
    metrics = GatewayMetrics(cache_s=cache_s)
    metrics.share(SlowSiblings())  # type: ignore[arg-type]
    until = time.monotonic() + run_s

    async def scraper() -> int:
        pages = 0
        while time.monotonic() < until:
            assert b"sluicegate_workers_reporting 2.0" in await metrics.page()
            pages += 1
            await asyncio.sleep(0.01)
        return pages

    served = await asyncio.gather(*(scraper() for _ in range(16)))
    assert sum(served) > 16 * 20
    assert 1 <= metrics.pages_built <= run_s / cache_s + 1
