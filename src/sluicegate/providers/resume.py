"""Resuming a streamed chat answer on another engine slot (OpenAI chat API, vLLM).

An engine at its batch limit frees a slot only when a sequence ends. To hand a slot to a
request within its tenant's share at once, the gateway may end the stream of a request
beyond its share and send it again later with the answer so far as an assistant message
to continue (vLLM's `continue_final_message`): the engine prefills that text and goes
on where it stopped, and the caller's stream carries on after a pause. Only plain
answers qualify: one choice, no tools, log-probabilities or constrained output (a
grammar would start again on the continuation), nothing the caller itself asked to
continue (a least output carries over), and no delta but text so far (a reasoning
model's thinking, a tool call or a refusal is not continued as text). The cut falls
between two events, so the caller's stream stays well formed; the answer so far is kept
as its text while it is relayed (`SoFar`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from sluicegate.core.call import Call
from sluicegate.core.types import Deployment, Endpoint
from sluicegate.providers.sse import events
from sluicegate.scheduling.handover import Giver

_NOT_PLAIN = (
    "tools",
    "functions",
    "logprobs",
    "top_logprobs",
    "continue_final_message",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "echo",
)
"""Fields that change how the answer is produced, so that a continuation would not go
on as the answer would have: set to anything but an empty or false value, the answer
is not handed over. `response_format` counts unless it asks for plain text, and
`min_tokens` carries over to the continuation."""
_FINISHED = (b"[DONE]", b'"finish_reason":"', b'"finish_reason": "')
_TEXT = frozenset(("role", "content"))


def resumable(call: Call, deployment: Deployment) -> bool:
    """Whether `call`'s stream on `deployment` may be cut and continued elsewhere."""
    payload = call.payload
    return (
        deployment.resumable
        and call.stream
        and call.endpoint is Endpoint.CHAT
        and payload.get("n", 1) == 1
        and not any(payload.get(field) for field in _NOT_PLAIN)
        and _plain_format(payload.get("response_format"))
        and isinstance(payload.get("messages"), list)
    )


def _plain_format(response_format: Any) -> bool:
    return not response_format or response_format == {"type": "text"}


def ends_event(chunk: bytes) -> bool:
    """Whether `chunk` ends an event: the bytes relayed so far may stop after it."""
    return chunk.endswith((b"\n\n", b"\r\n\r\n"))


def finishing(chunk: bytes) -> bool:
    """Whether `chunk` holds the answer's finish or the stream's end: from then on the
    stream is left to end (a usage event may still follow)."""
    return any(marker in chunk for marker in _FINISHED)


FOLD_AFTER = 32 * 1024
"""Relayed bytes kept as they came at most before they are read into the answer's text:
a short answer is never parsed unless it is asked for its slot, and a long one holds its
text (a few bytes a token), not the events that carried it (about 150 bytes each)."""


class SoFar:
    """The assistant text a stream has relayed, and how many tokens carried it: the
    backend's own count where its events report usage (an event may carry several
    tokens), else one per content event (a token each from vLLM's and the simulator's
    streams). None once an event carried anything but text (thinking, a tool call, a
    refusal) or the answer ended: that answer is not continued."""

    __slots__ = ("_events", "_plain", "_raw", "_raw_bytes", "_reported", "_text")

    def __init__(self) -> None:
        self._text: list[str] = []
        self._raw: list[bytes] = []
        self._raw_bytes = 0
        self._events = 0
        self._reported: int | None = None
        self._plain = True

    def add(self, chunk: bytes) -> None:
        if not self._plain:
            return
        self._raw.append(chunk)
        self._raw_bytes += len(chunk)
        if self._raw_bytes >= FOLD_AFTER:
            self._read()

    def answered(self) -> tuple[str, int] | None:
        self._read()
        if not self._plain:
            return None
        produced = self._events if self._reported is None else self._reported
        return "".join(self._text), produced

    def held_bytes(self) -> int:
        """What it keeps: the text and the bytes not read yet."""
        return sum(len(part) for part in self._text) + self._raw_bytes

    def _read(self) -> None:
        """Read the whole events among the bytes kept (`sse.events`); an event cut short
        waits for the rest of its bytes."""
        block = b"".join(self._raw)
        read = 0
        for raw, data in events(block):
            read += len(raw)
            if data is not None:
                self._take(data)
        tail = block[read:] if self._plain else b""
        self._raw = [tail] if tail else []
        self._raw_bytes = len(tail)

    def _take(self, data: bytes) -> None:
        if not self._plain:
            return
        if data == b"[DONE]":
            self._plain = False
            return
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if type(body) is not dict:
            return
        usage = body.get("usage")
        if type(usage) is dict and type(usage.get("completion_tokens")) is int:
            self._reported = usage["completion_tokens"]
        choices = body.get("choices")
        if type(choices) is not list or not choices or type(choices[0]) is not dict:
            return
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self._plain = False
            return
        delta = choice.get("delta")
        if type(delta) is not dict:
            return
        for key, value in delta.items():
            if value and key not in _TEXT:
                self._plain = False
                return
        content = delta.get("content")
        if type(content) is str and content:
            self._text.append(content)
            self._events += 1


def continuation(payload: dict[str, Any], text: str, produced: int) -> dict[str, Any]:
    """The body that continues `payload`'s answer after `text` (`produced` tokens): the
    answer so far as the final assistant message, and what is left of its output cap
    and of its least output."""
    body = {
        **payload,
        "messages": [*payload["messages"], {"role": "assistant", "content": text}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    for field in ("max_completion_tokens", "max_tokens"):
        cap = payload.get(field)
        if isinstance(cap, int):
            body[field] = max(1, cap - produced)
    least = payload.get("min_tokens")
    if isinstance(least, int):
        body["min_tokens"] = max(0, least - produced)
    return body


def without_opening(first: bytes) -> bytes:
    """The continued stream's first bytes less its opening event (the assistant role with
    no content), which the caller already had from the first part."""
    for raw, data in events(first):
        if data is not None and b'"role"' in data and b'"content":""' in data.replace(b" ", b""):
            return first[len(raw) :]
        break
    return first


class Relay:
    """The stream filter of an answer that may give its slot away: relays it until it
    ends or, asked to through its `giver`, reaches the end of an event (`handing_over`,
    the answer so far): at once if its bytes so far end one, the wait for the upstream's
    next bytes (a long engine step) interrupted. What it relayed is kept as text
    (`SoFar`): an answer that turned to more than text, or ended, meanwhile withdraws (an
    end is found even if its marker came split between two reads)."""

    __slots__ = ("_first", "_giver", "_so_far", "handing_over")

    def __init__(self, giver: Giver, first: bytes) -> None:
        self._giver = giver
        self._first = first
        self._so_far = SoFar()
        self._so_far.add(first)
        self.handing_over: tuple[str, int] | None = None

    async def chunks(self, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        giver, so_far = self._giver, self._so_far
        reader: asyncio.Task[Any] | None = None
        interrupted: tuple[str, int] | None = None  # the answer the read was stopped for
        finished = False

        def interrupt() -> bool:
            nonlocal interrupted
            answered = None if finished else so_far.answered()
            if answered is None:
                return False
            if reader is not None and interrupted is None:
                interrupted = answered
                reader.cancel()
            return True

        giver.interrupt = interrupt
        between = ends_event(self._first)
        while True:
            if giver.agreed and between:
                answered = so_far.answered()
                if answered is not None:
                    self.handing_over = answered
                    return
                giver.agreed = False  # withdrawn, not read back at every event on
            if between:
                reader = asyncio.current_task()
            try:
                chunk = await anext(rest)
            except StopAsyncIteration:
                giver.agreed = False
                return
            except asyncio.CancelledError:
                if interrupted is None or (reader is not None and reader.uncancel()):
                    raise
                self.handing_over = interrupted
                return
            finally:
                reader = None
            so_far.add(chunk)
            giver.relayed_events += chunk.count(b"\n\n")
            finished = finished or finishing(chunk)
            between = not finished and ends_event(chunk)
            yield chunk
