"""Anthropic's streamed Messages events rewritten as OpenAI `chat.completion.chunk` events.

Each upstream event is parsed once and its chunk written into a byte template built at
`message_start`, so a token costs one small JSON encoding. OpenAI numbers tool calls
among themselves where Anthropic numbers every content block, hence the index map.

Anthropic sends `message_start` before any content exists, and may follow it with an
`error` event (overloaded). The opening role chunk therefore waits for the first content:
until then nothing reaches the gateway, which can still fall back to another deployment.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.providers.anthropic_response import (
    cached_tokens,
    finish_reason,
    openai_usage,
    prompt_tokens,
)
from sluicegate.providers.sse import EventSplitter, EventTooLarge, events

_ROLE = b'{"role":"assistant","content":""}'
_DONE = b"data: [DONE]\n\n"


class StreamBroken(Exception):
    """The stream cannot go on: the upstream reported an error or sent something unreadable.

    `upstream_ended` is True when the upstream itself gave up on the answer."""

    def __init__(self, reason: str, *, upstream_ended: bool = False) -> None:
        super().__init__(reason)
        self.upstream_ended = upstream_ended


class StreamTranslator:
    """Fed the upstream bytes as they arrive, returns the OpenAI events they complete."""

    __slots__ = (
        "_completion",
        "_created",
        "_events",
        "_head",
        "_include_usage",
        "_prompt",
        "_role",
        "_stop_reason",
        "_tools",
        "cached_tokens",
        "completion_tokens",
        "used_tokens",
    )

    def __init__(self, created: int, include_usage: bool) -> None:
        self._created = created
        self._include_usage = include_usage
        self._head = b""
        self._role = b""
        self._events = EventSplitter()
        self._tools: dict[int, int] = {}
        self._prompt = 0
        self._completion = 0
        self._stop_reason: str | None = None
        self.used_tokens: int | None = None
        """Prompt + completion, set by `message_stop`: only a complete answer has it."""
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        """Prompt tokens read from Anthropic's cache, as `message_start` reported them."""

    def feed(self, data: bytes) -> bytes:
        try:
            block = self._events.feed(data)
        except EventTooLarge as exc:
            raise StreamBroken(str(exc)) from None
        return b"".join([self._event(payload) for _, payload in events(block) if payload])

    def finish(self) -> None:
        """Called at the end of the upstream body: an answer without `message_stop` was cut."""
        if self.used_tokens is None:
            raise StreamBroken("the stream ended before message_stop", upstream_ended=True)

    def _event(self, data: bytes) -> bytes:
        try:
            event = orjson.loads(data)
            return self._translate(event["type"], event)
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
            raise StreamBroken(f"unreadable event: {exc!r}") from None

    def _translate(self, kind: str, event: dict[str, Any]) -> bytes:
        match kind:
            case "message_start":
                return self._start(event["message"])
            case "content_block_start":
                return self._block(event["index"], event["content_block"])
            case "content_block_delta":
                return self._delta(event["index"], event["delta"])
            case "message_delta":
                self._stop_reason = event["delta"].get("stop_reason") or self._stop_reason
                self._completion = event.get("usage", {}).get("output_tokens", self._completion)
                return b""
            case "message_stop":
                return self._stop()
            case "error":
                error = event["error"]
                reason = f"{error.get('type')}: {error.get('message')}"
                raise StreamBroken(reason, upstream_ended=True)
            case _:  # ping, content_block_stop and event types added later
                return b""

    def _start(self, message: dict[str, Any]) -> bytes:
        head = {
            "id": message["id"],
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": message["model"],
        }
        self._head = b"data: " + orjson.dumps(head)[:-1]
        usage = message["usage"]
        self._prompt = prompt_tokens(usage)
        self.cached_tokens = cached_tokens(usage)
        self._completion = usage.get("output_tokens") or 0
        self._role = self._chunk(_ROLE)
        return b""

    def _block(self, index: int, block: dict[str, Any]) -> bytes:
        if block["type"] == "tool_use":
            position = self._tools[index] = len(self._tools)
            function = {"name": block["name"], "arguments": ""}
            call = {"index": position, "id": block["id"], "type": "function", "function": function}
            return self._chunk(orjson.dumps({"tool_calls": [call]}))
        if block["type"] == "text" and block["text"]:
            return self._chunk(orjson.dumps({"content": block["text"]}))
        return b""

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        if delta["type"] == "text_delta":
            return self._chunk(orjson.dumps({"content": delta["text"]}))
        if delta["type"] == "input_json_delta" and delta["partial_json"]:
            call = {"index": self._tools[index], "function": {"arguments": delta["partial_json"]}}
            return self._chunk(orjson.dumps({"tool_calls": [call]}))
        return b""  # thinking and signature deltas have no OpenAI counterpart

    def _stop(self) -> bytes:
        usage = openai_usage(self._prompt, self._completion)
        self.used_tokens = usage["total_tokens"]
        self.completion_tokens = usage["completion_tokens"]
        events = self._chunk(b"{}", orjson.dumps(finish_reason(self._stop_reason)))
        if self._include_usage:
            events += self._head + b',"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n"
        return events + _DONE

    def _chunk(self, delta: bytes, finish: bytes = b"null") -> bytes:
        if not self._head:
            raise StreamBroken("content came before message_start")
        chunk = (
            self._head
            + b',"choices":[{"index":0,"delta":'
            + delta
            + b',"logprobs":null,"finish_reason":'
            + finish
            + b"}]}\n\n"
        )
        if self._role:
            chunk, self._role = self._role + chunk, b""
        return chunk
