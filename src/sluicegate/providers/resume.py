"""Resuming a streamed chat answer on another engine slot (OpenAI chat API, vLLM).

An engine at its batch limit frees a slot only when a sequence ends. To hand a slot to a
request within its tenant's share at once, the gateway may end the stream of a request
beyond its share and send it again later with the answer so far as an assistant message
to continue (vLLM's `continue_final_message`): the engine prefills that text and goes
on where it stopped, and the caller's stream carries on after a pause. Only plain
answers qualify: one choice, no tools, log-probabilities or constrained output (a
grammar would start again on the continuation), nothing the caller itself asked to
continue, and no delta but text so far (a reasoning model's thinking, a tool call or a
refusal is not continued as text). The cut falls between two events, so the caller's
stream stays well formed; the answer so far is read back from the events relayed, only
when a hand-over is asked and when it happens.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.call import Call
from sluicegate.core.types import Deployment, Endpoint
from sluicegate.providers.sse import events

_NOT_PLAIN = (
    "tools",
    "functions",
    "logprobs",
    "top_logprobs",
    "continue_final_message",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "min_tokens",
    "echo",
)
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
        and isinstance(payload.get("messages"), list)
    )


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
    answer so far as the final assistant message, and what is left of its output cap."""
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
    return body


def without_opening(first: bytes) -> bytes:
    """The continued stream's first bytes less its opening event (the assistant role with
    no content), which the caller already had from the first part."""
    for raw, data in events(first):
        if data is not None and b'"role"' in data and b'"content":""' in data.replace(b" ", b""):
            return first[len(raw) :]
        break
    return first
