"""Hedged attempts: a second attempt once the first has gone `after_s` without an answer.

Both attempts are tasks owned here from the line that creates them. Whatever way the
race ends (an answer, both failed, the caller cancelled during the hedge delay), every
task but the winner's is cancelled, or its answer discarded, and kept until it has
really ended: its permits are released by its own clean-up, never left behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sluicegate.core.clock import Clock

T = TypeVar("T")


class Hedging:
    def __init__(self, clock: Clock, on_event: Callable[[str], None]) -> None:
        self._clock = clock
        self._on_event = on_event
        self._losers: set[asyncio.Future[Any]] = set()

    async def race(
        self,
        start: Callable[[bool], Awaitable[T]],
        after_s: float,
        discard: Callable[[T], Awaitable[None]],
    ) -> T:
        """The first attempt's result, or whichever of two answers first; the error of
        the first to fail when both do. `start` is told whether it starts the hedge."""
        tasks: list[asyncio.Future[T]] = [asyncio.ensure_future(start(False))]
        winner: asyncio.Future[T] | None = None
        try:
            if not await self._finished_by(tasks[0], self._clock.now() + after_s):
                self._on_event("sent")
                tasks.append(asyncio.ensure_future(start(True)))
            winner = await _first_success(tasks)
            if winner is not tasks[0]:
                self._on_event("won")
            return winner.result()
        finally:
            for task in tasks:
                if task is not winner:
                    self._let_go(task, discard)

    async def _finished_by(self, task: asyncio.Future[T], when_s: float) -> bool:
        """Wait for `task` until the clock reads `when_s`; has it finished?"""
        timeout = asyncio.get_running_loop().create_future()
        timer = self._clock.call_at(when_s, lambda: timeout.done() or timeout.set_result(None))
        try:
            await asyncio.wait((task, timeout), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            timeout.cancel()
        return task.done()

    def _let_go(self, task: asyncio.Future[T], discard: Callable[[T], Awaitable[None]]) -> None:
        """Cancel a running loser or discard a finished one's answer, and keep the task
        that does it until it has ended."""
        if not task.done():
            task.cancel()
            self._keep(task)
        elif not task.cancelled() and task.exception() is None:
            self._keep(asyncio.ensure_future(discard(task.result())))

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self._losers.add(task)
        task.add_done_callback(_forget(self._losers))


def _forget(losers: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    def done(task: asyncio.Future[Any]) -> None:
        losers.discard(task)
        if not task.cancelled():
            task.exception()

    return done


async def _first_success(tasks: list[asyncio.Future[T]]) -> asyncio.Future[T]:
    """The first task to succeed (the earlier one on a tie); raise the first failure
    when all fail."""
    pending = set(tasks)
    failures: list[BaseException] = []
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task not in done:
                continue
            error = task.exception()
            if error is None:
                return task
            failures.append(error)
    raise failures[0]
