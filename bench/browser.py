"""Debian's headless chromium driven by Playwright, for the status page's test and
screenshot. No browser is downloaded (`playwright install` is never run): Playwright
launches the machine's own chromium, kept off the network beyond loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from playwright.async_api import Browser, Page, Playwright

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


async def launch(playwright: Playwright) -> Browser:
    return await playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=ARGS, timeout=30_000
    )


async def updates(page: Page) -> int:
    """Status documents the page has rendered."""
    return int(await page.evaluate("document.getElementById('feed').dataset.updates"))


async def wait_updates(page: Page, count: int, timeout_s: float = 15.0) -> None:
    """Until the page has rendered `count` documents. Polled from here rather than by
    `wait_for_function`, whose script the page's Content-Security-Policy forbids."""
    async with asyncio.timeout(timeout_s):
        while await updates(page) < count:  # noqa: ASYNC110 - the count lives in the page
            await asyncio.sleep(0.1)


async def log_in(page: Page, url: str, key: str) -> None:
    """Through the page's own login form."""
    await page.goto(f"{url}/status")
    await page.fill("#key", key)
    async with page.expect_navigation():
        await page.click("button[type=submit]")
