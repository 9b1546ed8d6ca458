"""Checks on a model's answer: post-call guardrails on a whole body or, for a stream,
through the bounded hold-back; and parallel checks the answer waits for (or, where the
rule allows, a stream is cut by).

A stream with no check here never comes through this module: it stays the upstream's
bytes. A checked stream's events leave as they arrived unless a split at the window's
edge or a mask changed their text, and a failed check ends it with a
`finish_reason: "content_filter"` event before the refusal the edge turns into an error
event; the text that failed never leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from sluicegate.core.errors import GatewayError
from sluicegate.core.guarding import Action
from sluicegate.guardrails.checker import Stage
from sluicegate.guardrails.guard import Guardrail, Outcome, screen
from sluicegate.guardrails.holdback import Held, HoldBack, Release
from sluicegate.guardrails.texts import answer_places, delta_places, rewritten, texts
from sluicegate.providers.sse import EventSplitter, events


class OutputChecks:
    """What one answer must pass: `post` guardrails, and a `parallel` task that raises
    if the request's parallel checks refused it."""

    __slots__ = ("_cut", "_parallel", "_post", "_window")

    def __init__(
        self,
        post: Sequence[Guardrail],
        window: int,
        parallel: asyncio.Future[Any] | None = None,
        cut: bool = False,
    ) -> None:
        self._post = post
        self._window = window
        self._parallel = parallel
        self._cut = cut

    async def ready(self) -> None:
        """Wait for the parallel checks before the answer is handed over (raising their
        refusal, so it is answered as an error rather than after a 200), except on a
        stream that may be cut instead."""
        if self._parallel is not None and not self._cut:
            await self._parallel

    async def body(self, body: bytes) -> bytes:
        if self._parallel is not None:
            await self._parallel
        if self._post:
            body = await checked_body(self._post, body)
        return body

    def stream(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        if self._parallel is not None and self._cut:
            chunks = cut_by(self._parallel, chunks)
        if self._post:
            chunks = checked_stream(self._post, self._window, chunks)
        return chunks


async def cut_by(check: asyncio.Future[Any], chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Chunks leave at once, but each one behind the last: the stream is cut when `check`
    fails, and its end waits for it."""
    last: bytes | None = None
    async for chunk in chunks:
        if check.done():
            check.result()
        if last is not None:
            yield last
        last = chunk
    await check
    if last is not None:
        yield last


async def checked_body(guardrails: Sequence[Guardrail], body: bytes) -> bytes:
    """The body, or its copy with masked texts; raises the first refusal."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(document, dict):
        return body
    pieces = texts(answer_places(document))
    if not pieces:
        return body
    checked = await screen(guardrails, pieces, Stage.OUTPUT)
    if checked == pieces:
        return body
    return orjson.dumps(rewritten(document, answer_places, checked))


async def checked_stream(
    guardrails: Sequence[Guardrail], window: int, chunks: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    splitter = EventSplitter()
    hold = HoldBack(window)
    last: dict[str, Any] | None = None
    async for chunk in chunks:
        grew = False
        for raw, data in events(splitter.feed(chunk)):
            held = _held(raw, data)
            hold.add(held)
            if held.texts:
                grew = grew or held.size > 0
                last = held.event[0]
        if grew:
            refusal = await _check(guardrails, hold)
            if refusal is not None:
                if last is not None:
                    yield _content_filter(last)
                raise refusal
        released = hold.release()
        if released:
            yield _rendered(released)
    rest = splitter.rest()
    if rest:
        hold.add(Held(rest))
    released = hold.release(everything=True)
    if released:
        yield _rendered(released)


async def _check(guardrails: Sequence[Guardrail], hold: HoldBack) -> GatewayError | None:
    text = hold.text()
    for guardrail in guardrails:
        decision = await guardrail.check(text, Stage.OUTPUT)
        refusal = decision.refusal(Stage.OUTPUT)
        if refusal is not None:
            return refusal
        if decision.action is Action.MASK and decision.outcome is Outcome.FLAGGED:
            hold.mask(decision.verdict)
            text = hold.text()
    return None


def _held(raw: bytes, data: bytes | None) -> Held:
    if data is None or data == b"[DONE]":
        return Held(raw)
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return Held(raw)
    if not isinstance(event, dict):
        return Held(raw)
    places = delta_places(event)
    return Held(raw, (event, places), texts(places)) if places else Held(raw)


def _rendered(released: list[Release]) -> bytes:
    parts: list[bytes] = []
    for release in released:
        if release.texts is None:
            parts.append(release.held.raw)
            continue
        event, places = release.held.event
        for (container, key), text in zip(places, release.texts, strict=True):
            container[key] = text
        parts.append(b"data: " + orjson.dumps(event) + b"\n\n")
    return b"".join(parts)


def _content_filter(last: dict[str, Any]) -> bytes:
    """A closing event in the stream's own shape: its choices end with content_filter."""
    event = {k: v for k, v in last.items() if k not in ("choices", "usage")}
    choices = []
    for choice in last.get("choices") or ():
        index = choice.get("index", 0) if isinstance(choice, dict) else 0
        ending: dict[str, Any] = {"index": index}
        if isinstance(choice, dict) and "delta" in choice:
            ending["delta"] = {}
        else:
            ending["text"] = ""
        ending["finish_reason"] = "content_filter"
        choices.append(ending)
    event["choices"] = choices
    return b"data: " + orjson.dumps(event) + b"\n\n"
