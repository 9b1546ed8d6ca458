"""A screenshot of the status page during the demo's noisy neighbour, for the README's quickstart.

Starts the demo as `make run` does (its own free ports), sends it the load `make
demo-load` sends, logs in through the page's form in Debian's headless chromium and
photographs the page `--after-s` seconds into the load; then stops everything.

    flock /tmp/sluicegate-bench.lock .venv/bin/python -m bench.status_screenshot
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.async_api import async_playwright

from bench.browser import launch, log_in, updates, wait_updates
from sluicegate.children import spawn, stop
from sluicegate.serve import DEMO_ADMIN_KEY, DEMO_SIM_PORT

ROOT = Path(__file__).parents[1]
DEMO_LOAD = ROOT / "src" / "sluicegate" / "demo-load.yaml"
KEYS = {"SLUICEGATE_DEMO_KEY_ALICE": "sk-demo-alice", "SLUICEGATE_DEMO_KEY_BOB": "sk-demo-bob"}
READY_WITHIN_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(f"the demo exited with {child.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the demo did not become ready in time")


async def photograph(url: str, out: Path, after_s: float) -> None:
    async with async_playwright() as playwright:
        browser = await launch(playwright)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 1000})
            await log_in(page, url, DEMO_ADMIN_KEY)
            await wait_updates(page, 1)
            await asyncio.sleep(after_s)
            await wait_updates(page, await updates(page) + 1)
            await page.screenshot(path=str(out), full_page=True)
        finally:
            await browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out", type=Path, nargs="?", default=ROOT / "docs" / "status-page.png", help="the PNG"
    )
    parser.add_argument("--after-s", type=float, default=25.0, help="into the load (default 25)")
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, DEMO_SIM_PORT: str(free_port()), "SLUICEGATE_PORT": str(port)}
    url = f"http://127.0.0.1:{port}"
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    demo = spawn([sys.executable, "-m", "sluicegate", "serve"], env=env, cwd=results)
    load = None
    try:
        wait_ready(url, demo)
        command = [sys.executable, "-m", "sluicegate", "bench", "run", str(DEMO_LOAD)]
        command += ["--target", f"{url}/v1", "--out", str(results / "screenshot")]
        load = spawn(command, env={**os.environ, **KEYS}, stdout=subprocess.DEVNULL)
        asyncio.run(photograph(url, args.out, args.after_s))
    finally:
        if load is not None:
            stop(load, grace_s=5)
        stop(demo, grace_s=10)
    print(f"status page: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
