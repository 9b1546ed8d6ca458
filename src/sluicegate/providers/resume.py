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
between two events, so the caller's stream stays well formed; the answer so far is read
back from the events relayed, only when a hand-over is asked and when it happens.
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


def answered_so_far(relayed: list[bytes]) -> tuple[str, int] | None:
    """The assistant text the caller has received and how many content events carried it
    (a token each from vLLM's and the simulator's streams); None when an event carried
    anything but text (thinking, a tool call, a refusal) or the answer ended: that
    answer is not continued."""
    parts: list[str] = []
    for _, data in events(b"".join(relayed)):
        if data == b"[DONE]":
            return None
        if data is None:
            continue
        try:
            choices = orjson.loads(data)["choices"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
        if not isinstance(choices, list) or not choices:
            continue
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        if choice.get("finish_reason") is not None:
            return None
        if not isinstance(delta, dict):
            continue
        if any(value for key, value in delta.items() if key not in _TEXT):
            return None
        content = delta.get("content")
        if isinstance(content, str) and content:
            parts.append(content)
    return "".join(parts), len(parts)


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
    next bytes (a long engine step) interrupted. Its bytes are kept, to be read back
    only when asked and at the cut: an answer that turned to more than text, or ended,
    meanwhile withdraws (read back whole, an end is found even if its marker came split
    between two reads)."""

    __slots__ = ("_giver", "_relayed", "handing_over")

    def __init__(self, giver: Giver, first: bytes) -> None:
        self._giver = giver
        self._relayed = [first]
        self.handing_over: tuple[str, int] | None = None

    async def chunks(self, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        giver, relayed = self._giver, self._relayed
        reader: asyncio.Task[Any] | None = None
        interrupted: tuple[str, int] | None = None  # the answer the read was stopped for
        finished = False

        def interrupt() -> bool:
            nonlocal interrupted
            answered = None if finished else answered_so_far(relayed)
            if answered is None:
                return False
            if reader is not None and interrupted is None:
                interrupted = answered
                reader.cancel()
            return True

        giver.interrupt = interrupt
        between = ends_event(relayed[0])
        while True:
            if giver.agreed and between:
                answered = answered_so_far(relayed)
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
            relayed.append(chunk)
            giver.relayed_events += chunk.count(b"\n\n")
            finished = finished or finishing(chunk)
            between = not finished and ends_event(chunk)
            yield chunk
