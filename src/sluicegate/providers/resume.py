"""Resuming a streamed chat answer on another engine slot (OpenAI chat API, vLLM).

An engine at its batch limit frees a slot only when a sequence ends. To hand a slot to a
request within its tenant's share at once, the gateway may end the stream of a request
beyond its share and send it again later with the answer so far as an assistant message
to continue (vLLM's `continue_final_message`): the engine prefills that text and goes
on where it stopped, and the caller's stream carries on after a pause. Only plain
answers qualify: one choice, no tools or log-probabilities, nothing the caller itself
asked to continue. The cut falls between two events, so the caller's stream stays well
formed; the answer so far is read back from the events relayed, only when the cut
happens.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.call import Call
from sluicegate.core.types import Deployment, Endpoint
from sluicegate.providers.sse import events

_NOT_PLAIN = ("tools", "functions", "logprobs", "top_logprobs", "continue_final_message")
_FINISHED = (b"[DONE]", b'"finish_reason":"', b'"finish_reason": "')


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


def at_event_end(chunk: bytes) -> bool:
    """Whether the bytes relayed so far may stop after `chunk`: it ends an event and the
    answer is not already finishing."""
    return chunk.endswith((b"\n\n", b"\r\n\r\n")) and not any(m in chunk for m in _FINISHED)


def answered_so_far(relayed: list[bytes]) -> tuple[str, int]:
    """The assistant text the caller has received and how many content events carried it
    (a token each from vLLM's and the simulator's streams)."""
    parts: list[str] = []
    block = b"".join(relayed)
    for _, data in events(block):
        if data is None or data == b"[DONE]":
            continue
        try:
            chunk = orjson.loads(data)
            content = chunk["choices"][0]["delta"].get("content")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            continue
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
