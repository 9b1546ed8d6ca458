"""The texts of a request and of a non-streamed answer, and the same documents with their
texts replaced: what a guardrail checks and what a masking one rewrites.

A request's texts are every message's content (text parts of a list content included),
a completion's prompt strings and an embedding's input strings; an answer's are each
choice's content (or text) and its tool calls' arguments. Token-id prompts carry no
text. A rewrite copies the document and never writes to the one it was given (a
caller's payload is shared by every attempt).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

Place = tuple[Any, Any]
"""A container and the key (or index) in it that holds one text."""


def request_places(route: str, payload: dict[str, Any]) -> list[Place]:
    if route == "chat":
        return list(_message_places(payload.get("messages")))
    field = "prompt" if route == "completions" else "input"
    return list(_string_places(payload, field))


def answer_places(body: dict[str, Any]) -> list[Place]:
    return _choice_places(body, "message")


def texts(places: list[Place]) -> list[str]:
    return [container[key] for container, key in places]


def rewritten(
    document: dict[str, Any], find: Callable[[dict[str, Any]], list[Place]], new: list[str]
) -> dict[str, Any]:
    """A copy of `document` whose texts (as `find` lists them) are `new`."""
    copied = copy.deepcopy(document)
    for (container, key), text in zip(find(copied), new, strict=True):
        container[key] = text
    return copied


def _message_places(messages: object) -> Iterator[Place]:
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            yield message, "content"
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part, "text"
        yield from _tool_places(message.get("tool_calls"))


def _tool_places(calls: object) -> Iterator[Place]:
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            yield function, "arguments"


def _string_places(container: dict[str, Any], field: str) -> Iterator[Place]:
    value = container.get(field)
    if isinstance(value, str):
        yield container, field
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, str):
                yield value, index


def delta_places(event: dict[str, Any]) -> list[Place]:
    """The texts of one streamed event: each choice's content delta (or text) and its
    tool calls' argument deltas."""
    return _choice_places(event, "delta")


def _choice_places(body: dict[str, Any], inner: str) -> list[Place]:
    """Each choice's text, and the content and tool-call arguments of its `inner` object
    (`message` in a body, `delta` in a streamed event)."""
    found: list[Place] = []
    choices = body.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        found += _string_places(choice, "text")
        part = choice.get(inner)
        if isinstance(part, dict):
            found += _string_places(part, "content")
            found += _tool_places(part.get("tool_calls"))
    return found
