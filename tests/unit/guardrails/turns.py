"""How many turns the event loop gets while a check runs: the measure of a bounded scan."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def turns_during(work: Awaitable[object]) -> int:
    """Loop turns another task gets while `work` runs; 0 when it runs in one go."""
    turns = 0
    done = False

    async def count() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count())
    await asyncio.sleep(0)
    turns = 0
    await work
    done = True
    await counter
    return turns
