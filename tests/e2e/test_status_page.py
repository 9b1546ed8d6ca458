"""The status page in a real browser: Debian's headless chromium, driven by Playwright,
logs in through the page's form against a real gateway in front of the simulator, and
after traffic from a real client every figure the page shows equals `/admin/status`'s
and `/metrics`'."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.browser import CHROMIUM, launch, log_in, updates, wait_updates
from tests.e2e.conftest import SIM_KEY
from tests.support.processes import Proc, start

ADMIN = "sk-status-admin"
ALICE = "sk-status-alice"
BOB = "sk-status-bob"
SETTLE_TRIES = 10
NOTHING = "\u2013"
"""What the page shows for a figure not known (an en dash)."""


def key(*path: str) -> str:
    """A figure's path as the page's script writes it (JSON.stringify)."""
    return json.dumps(list(path), separators=(",", ":"))


def chromium_or_skip() -> None:
    """Without chromium the test skips on a developer's machine and fails in CI."""
    if CHROMIUM.exists():
        return
    message = f"{CHROMIUM} is missing (apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def config(sim_url: str) -> dict[str, Any]:
    return {
        "admin": {"keys": [{"env": "STATUS_ADMIN_KEY"}]},
        "pools": [{"name": "sim", "max_concurrency": 8}],
        "models": [
            {
                "name": "chat",
                "deployments": [
                    {
                        "name": "sim-chat",
                        "base_url": f"{sim_url}/v1",
                        "model": "sim-model",
                        "api_key_env": "SIM_KEY",
                        "pools": ["sim"],
                        "metrics": {"interval_s": 0.25, "max_num_seqs": 32},
                        "price": {"input": 0.3, "output": 1.7},
                    }
                ],
            }
        ],
        "scheduling": {
            "lanes": [
                {"name": "interactive", "priority": 100, "ttft_slo_s": 2, "queue_size": 32},
                {"name": "batch", "priority": 0, "queue_size": 64, "max_backend_waiting": 0},
            ]
        },
        "tenants": [
            {"name": "alice", "keys": [{"sha256": hashlib.sha256(ALICE.encode()).hexdigest()}]},
            {"name": "bob", "keys": [{"sha256": hashlib.sha256(BOB.encode()).hexdigest()}]},
        ],
    }


@pytest.fixture
async def gateway(sim: Proc, tmp_path: Path) -> AsyncIterator[Proc]:
    path = tmp_path / "status.yaml"
    path.write_text(yaml.safe_dump(config(sim.url)))
    env = {"SIM_KEY": SIM_KEY, "STATUS_ADMIN_KEY": ADMIN}
    proc = start("serve", ["--config", str(path)], tmp_path, env=env, ready_path="/ready")
    yield proc
    proc.stop()


async def traffic(url: str) -> None:
    """Chats of two tenants in two lanes, and a request for a model that does not exist."""
    alice = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=ALICE, max_retries=0)
    bob = openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key=BOB,
        max_retries=0,
        default_headers={"X-Sluicegate-Lane": "batch"},
    )
    messages = [{"role": "user", "content": "hello there"}]

    async def chat(client: openai.AsyncOpenAI, model: str = "chat") -> None:
        await client.chat.completions.create(model=model, messages=messages, max_tokens=8)

    await asyncio.gather(*(chat(alice) for _ in range(12)), *(chat(bob) for _ in range(6)))
    with pytest.raises(openai.NotFoundError):
        await chat(alice, "no-such-model")
    await asyncio.gather(alice.close(), bob.close())


def at(document: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(document, dict) or key not in document:
            return None
        document = document[key]
    return document


def shown(value: Any) -> str:
    """As the page's script writes a value: JavaScript's String() of a JSON number."""
    if value is None:
        return NOTHING
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def fixed3(value: float) -> str:
    """JavaScript's toFixed(3): the nearest, ties away from zero, on the exact binary value."""
    return str(Decimal(value).quantize(Decimal("0.001"), ROUND_HALF_UP))


def derived(document: dict[str, Any]) -> dict[str, str]:
    """The figures the page works out from the document: totals over the history, the last
    whole second, and each tenant's share of its lane's accepted requests."""
    history = document["history"]
    seconds = history["seconds"].values()
    found = {}
    last = history["seconds"].get(str(history["now_s"] - 1), {})
    for kind in ("offered", "accepted", "met"):
        found[key("history", kind)] = str(sum(s[kind] for s in seconds))
        found[key("last_second", kind)] = str(last.get(kind, 0))
    tenants = document["slo"]["tenants"]
    for tenant, lanes in tenants.items():
        for lane, figures in lanes.items():
            total = sum(t[lane]["accepted"] for t in tenants.values() if lane in t)
            share = fixed3(figures["accepted"] / total) if total else NOTHING
            found[key("share", tenant, lane)] = share
    for model, entry in document["models"].items():
        for lane in entry["lanes"]:
            figures = at(document, ["slo", "models", model, lane]) or {}
            priced = figures.get("priced_successes")
            micro = figures["success_nanos"] / priced / 1000 if priced else None
            found[key("micro_per_success", model, lane)] = (
                NOTHING if micro is None else fixed3(micro)
            )
    spend = document["spend"]
    for tenant, models in spend["tenants"].items():
        for model, figures in models.items():
            for name in ("nanos", "estimated_nanos"):
                nanos = figures[name]
                label = name.replace("nanos", "dollars")
                found[key(label, tenant, model)] = f"{nanos // 10**9}.{nanos % 10**9:09d}"
    found[key("unpriced")] = spend["unpriced_deployments"] or "none"
    return found


class Metrics:
    """One scrape of `/metrics`, by family and labels."""

    def __init__(self, text: str) -> None:
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float | None:
        found = [v for n, ls, v in self.samples if n == name and labels.items() <= ls.items()]
        return sum(found) if found else None

    def hot(self, name: str, **labels: str) -> str:
        """The state of a one-hot family."""
        (state,) = [
            ls["state"]
            for n, ls, v in self.samples
            if n == name and labels.items() <= ls.items() and v == 1
        ]
        return state


KINDS = {"offered": (), "accepted": ("met", "missed", "failed"), "met": ("met",)}
"""The outcome kinds each figure counts (offered: every kind)."""


def counted(metrics: Metrics, family: str, figure: str, **labels: str) -> float:
    if not KINDS[figure]:
        return metrics.value(family, **labels) or 0
    return sum(metrics.value(family, kind=k, **labels) or 0 for k in KINDS[figure])


def from_metrics(path: list[str], metrics: Metrics) -> str | None:
    """What `/metrics` says of the figure at `path`, shown as the page shows it; None for a
    figure `/metrics` does not carry (the lanes' recent window is `/admin/status`'s own)."""
    match path:
        case ["overload", "state"]:
            return metrics.hot("sluicegate_overload_state")
        case ["overload", "pressure"]:
            return shown(round(metrics.value("sluicegate_overload_pressure") or 0.0, 3))
        case ["pools", pool, field]:
            name = {
                "active": "sluicegate_pool_active_attempts",
                "limit": "sluicegate_pool_concurrency_limit",
                "cooldown_s": "sluicegate_pool_cooldown_seconds",
            }[field]
            return shown(round(metrics.value(name, pool=pool) or 0.0, 3))
        case ["models", model, "lanes", lane, "service", tenant]:
            value = metrics.value(
                "sluicegate_tenant_service", model=model, lane=lane, tenant=tenant
            )
            return shown(round(value or 0.0, 3))
        case ["models", model, "lanes", lane, field] if field in ("queued", "oldest_age_s"):
            name = {
                "queued": "sluicegate_queue_depth",
                "oldest_age_s": "sluicegate_queue_oldest_age_seconds",
            }[field]
            return shown(round(metrics.value(name, model=model, lane=lane) or 0.0, 3))
        case ["models", _, "deployments", deployment, "gate"]:
            return metrics.hot("sluicegate_dispatch_gate", deployment=deployment)
        case ["models", _, "deployments", deployment, "circuit"]:
            return metrics.hot("sluicegate_circuit", deployment=deployment)
        case ["models", _, "deployments", deployment, "backend", field]:
            name = {"tpot_s": "tpot_seconds"}.get(field, field)
            value = metrics.value(f"sluicegate_backend_{name}", deployment=deployment)
            return shown(None if value is None else round(value, 3))
        case ["slo", "tenants", tenant, lane, kind] if kind in KINDS:
            family = "sluicegate_tenant_request_outcomes_total"
            return shown(counted(metrics, family, kind, tenant=tenant, lane=lane))
        case ["slo", "models", model, lane, kind] if kind in KINDS:
            family = "sluicegate_request_outcomes_total"
            return shown(counted(metrics, family, kind, model=model, lane=lane))
    return None


def history_from_metrics(metrics: Metrics) -> dict[str, str]:
    family = "sluicegate_request_outcomes_total"
    return {key("history", kind): shown(counted(metrics, family, kind)) for kind in KINDS}


async def page_figures(page: Any, kind: str) -> dict[str, str]:
    pairs = await page.eval_on_selector_all(
        f"[data-{kind}]", f"els => els.map(e => [e.dataset.{kind}, e.textContent])"
    )
    return dict(pairs)


async def mismatches(page: Any, http: aiohttp.ClientSession, url: str) -> list[str]:
    """Every figure on the page that differs from `/admin/status` or `/metrics`, read after
    the page's latest update."""
    figures, worked = await page_figures(page, "figure"), await page_figures(page, "derived")
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with http.get(f"{url}/admin/status", headers=headers) as resp:
        document = await resp.json()
    async with http.get(f"{url}/metrics") as resp:
        metrics = Metrics(await resp.text())
    wrong = []
    for name, text in figures.items():
        path = json.loads(name)
        if text != shown(at(document, path)):
            wrong.append(f"{name}: page {text!r}, /admin/status {at(document, path)!r}")
        expected = from_metrics(path, metrics)
        if expected is not None and text != expected:
            wrong.append(f"{name}: page {text!r}, /metrics {expected!r}")
    expected_worked = derived(document)
    for name, text in worked.items():
        if text != expected_worked.get(name):
            wrong.append(f"{name}: page {text!r}, /admin/status {expected_worked.get(name)!r}")
    for name, text in history_from_metrics(metrics).items():
        if worked.get(name) != text:
            wrong.append(f"{name}: page {worked.get(name)!r}, /metrics {text!r}")
    return wrong


async def test_every_figure_on_the_live_page_equals_the_gateways_own(gateway: Proc, http):
    chromium_or_skip()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await launch(playwright)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 1300})
            await page.goto(f"{gateway.url}/status")
            assert await page.locator("form[action='/admin/login']").count() == 1
            await log_in(page, gateway.url, ADMIN)
            assert page.url == f"{gateway.url}/status"
            assert ADMIN not in await page.content()
            await wait_updates(page, 1)
            assert (await page_figures(page, "derived"))[key("history", "offered")] == "0"

            await traffic(gateway.url)
            await wait_updates(page, await updates(page) + 2)
            figures = await page_figures(page, "figure")
            assert figures[key("slo", "tenants", "alice", "interactive", "met")] == "12"
            assert figures[key("slo", "tenants", "bob", "batch", "met")] == "6"
            assert figures[key("pools", "sim", "limit")] == "8"
            assert figures[key("spend", "tenants", "alice", "chat", "attempts")] == "12"
            assert (await page_figures(page, "derived"))[key("dollars", "bob", "chat")] > "0.0"
            assert (await page_figures(page, "derived"))[key("history", "offered")] == "19"

            for _ in range(SETTLE_TRIES):
                wrong = await mismatches(page, http, gateway.url)
                if not wrong:
                    break
                await wait_updates(page, await updates(page) + 1)
            assert wrong == []
        finally:
            await browser.close()
