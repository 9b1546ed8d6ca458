"""An upstream answer as the pipeline hands it to its caller, and what one attempt holds.

`Answer` is the caller's side from the first bytes on, a stream's hand-over to a new
attempt included; `Held` releases one attempt's dispatcher grant and upstream call
exactly once; `Started` pairs them for the attempt that won.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from sluicegate.core.call import Call
from sluicegate.core.clock import Clock
from sluicegate.guardrails.output import OutputChecks
from sluicegate.providers.base import UpstreamResponse
from sluicegate.providers.resume import Relay, without_opening
from sluicegate.scheduling.attempt import Attempt
from sluicegate.scheduling.handover import Giver


@dataclass(slots=True)
class Started:
    """An attempt whose first bytes arrived: its grant and upstream call are `held`."""

    held: Held
    attempt: Attempt
    answer: Answer

    async def discard(self) -> None:
        """Nobody will read this answer (a hedge that lost): end it as abandoned."""
        self.attempt.end(asyncio.CancelledError())
        await self.held.aclose()


class Held:
    """What one attempt holds: its dispatcher grant (once `granted`) and its upstream
    call (once opened), released in reverse order exactly once, the grant even when
    ending the call fails. Two fixed parts, so a plain class rather than an exit stack:
    every attempt makes one."""

    __slots__ = ("_attempt", "_opened", "_release", "granted")

    def __init__(self, release: Callable[[Attempt], Awaitable[None]], attempt: Attempt) -> None:
        self._release = release
        self._attempt = attempt
        self._opened: AbstractAsyncContextManager[UpstreamResponse] | None = None
        self.granted = False

    async def open(self, opened: AbstractAsyncContextManager[UpstreamResponse]) -> UpstreamResponse:
        upstream = await opened.__aenter__()
        self._opened = opened
        return upstream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        opened, self._opened = self._opened, None
        granted, self.granted = self.granted, False
        try:
            if opened is not None:
                return await opened.__aexit__(exc_type, exc, traceback)
            return None
        finally:
            if granted:
                await self._release(self._attempt)

    async def aclose(self) -> None:
        await self.__aexit__(None, None, None)


class Answer:
    """An upstream answer whose first bytes are in hand: from here on no retry can happen
    without the client seeing it. A stream that may give its slot away (`gives`) offers
    it to its dispatcher through a `Giver`; asked, it goes on from a new attempt, its
    caller seeing a pause between two whole events (`providers.resume`); `part` holds
    the current attempt's permits and upstream, released when the answer ends. The last
    attempt's usage is the request's own (the answer before the pause counted as its
    prompt), what its quotas settle on; the prefill again is the hand-over's cost, not
    the caller's."""

    __slots__ = (
        "_before",
        "_body",
        "_clock",
        "_first",
        "_on_first",
        "_rest",
        "_resume",
        "_upstream",
        "attempt",
        "checked_s",
        "checks",
        "giver",
        "opened",
        "part",
        "primed_s",
    )

    def __init__(
        self,
        upstream: UpstreamResponse,
        attempt: Attempt,
        clock: Clock,
        on_first: Callable[[Attempt, Giver | None], None],
        resume: Callable[[Call, str, int], Awaitable[Started]],
        gives: bool = False,
    ) -> None:
        self._upstream = upstream
        self.attempt = attempt
        self.opened = attempt
        """The attempt whose first bytes the caller got: the request's timings are its."""
        self._clock = clock
        self._on_first = on_first
        self._resume = resume
        self._body = b""
        self._first = b""
        self._rest: AsyncIterator[bytes] | None = None
        self.giver = Giver() if gives else None
        """The current stream's side of a hand-over, while it may give its slot away."""
        self.part: Held | None = None
        self._before = 0
        """Tokens the parts before the current one produced."""
        self.primed_s: float | None = None
        """When the deployment's first bytes (a non-streamed answer's whole body) were
        in hand."""
        self.checks: OutputChecks | None = None
        """The guardrails the answer must pass before its caller gets it; None: none."""
        self.checked_s: float | None = None
        """When a non-streamed answer passed them."""

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self.part is not None
        return await self.part.__aexit__(*exc_info)

    @property
    def call(self) -> Call:
        return self.attempt.call

    @property
    def upstream(self) -> UpstreamResponse:
        return self._upstream

    async def prime(self) -> None:
        attempt = self.attempt
        if attempt.call.stream:
            chunks = self._upstream.chunks()
            priced = attempt.call.bill is not None
            # A stream that may be handed over is relayed through `Relay`: counted by a
            # layer of its own; any other is counted where `chunks` relays it.
            self._rest = _counted(chunks, attempt) if priced and self.giver else chunks
            self._first = await anext(self._rest)
            if priced and not self.giver:
                attempt.relayed += self._first.count(b"data:")
            self.primed_s = self._clock.now()
        else:
            self._body = await self._upstream.read()
            self.primed_s = self.attempt.first_byte_s = self._clock.now()

    async def read(self) -> bytes:
        checks = self.checks
        if checks is None:
            return self._body
        body = await checks.body(self._body)
        self.checked_s = self._clock.now()
        return body

    def produced(self) -> int | None:
        """The answer's completion tokens over all its parts; None while unknown."""
        produced = self.attempt.produced()
        return None if produced is None else self._before + produced

    def chunks(self) -> AsyncIterator[bytes]:
        """The stream as it arrives, through its guardrails when it has any."""
        checks = self.checks
        if checks is None:
            return self._chunks()
        return checks.stream(self._chunks())

    async def _chunks(self) -> AsyncIterator[bytes]:
        """The stream as it arrives; its first byte is timed as it is handed over."""
        self.attempt.first_byte_s = self._clock.now()
        self._on_first(self.attempt, self.giver)
        first = self._first
        while True:
            rest, giver = self._rest, self.giver
            assert rest is not None, "chunks() of a non-streamed answer"
            if first:
                yield first
            if giver is None:
                attempt = self.attempt
                if attempt.call.bill is None:
                    async for chunk in rest:
                        yield chunk
                    return
                async for chunk in rest:
                    attempt.relayed += chunk.count(b"data:")
                    yield chunk
                return
            relay = Relay(giver, first)
            async for chunk in relay.chunks(rest):
                yield chunk
            if relay.handing_over is None:
                return
            first = await self._go_on(*relay.handing_over)

    async def _go_on(self, text: str, produced: int) -> bytes:
        """End this part where the caller's stream stands, after `text` (`produced`
        tokens), and continue in a new attempt: the first bytes of its stream, less the
        opening the caller already had."""
        attempt, upstream, part = self.attempt, self._upstream, self.part
        assert part is not None
        assert self._rest is not None
        upstream.used_tokens = attempt.call.prompt_tokens + produced
        upstream.completion_tokens = produced
        self._before = produced
        upstream.hand_over()
        await self._rest.aclose()
        attempt.end(asyncio.CancelledError())
        await part.aclose()
        started = await self._resume(attempt.call, text, produced)
        rest = started.answer
        self.part, self.attempt = started.held, started.attempt
        self._upstream, self._rest = rest._upstream, rest._rest
        self.attempt.first_byte_s = self._clock.now()
        self.giver = None
        self._on_first(self.attempt, None)
        return without_opening(rest._first)


async def _counted(chunks: AsyncIterator[bytes], attempt: Attempt) -> AsyncIterator[bytes]:
    """A priced stream's chunks, its events counted as they pass: its output, should it
    end without the provider's usage."""
    try:
        async for chunk in chunks:
            attempt.relayed += chunk.count(b"data:")
            yield chunk
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
