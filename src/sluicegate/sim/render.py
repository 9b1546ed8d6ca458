"""OpenAI response bodies and SSE events, in the exact shapes the official SDK parses.

Streamed events are assembled from byte templates built once per request, so a token
costs a list lookup and a join rather than a JSON encoding.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import struct
from typing import Literal

import orjson

Kind = Literal["chat", "completion"]

WORDS = (
    " lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit",
    " sed", " do", " eiusmod", " tempor", " incididunt", " ut", " labore", " et", " dolore",
    " magna", " aliqua",
)  # fmt: skip
_WORDS_JSON = tuple(orjson.dumps(word) for word in WORDS)
_EMBEDDING_SIZE = 16
_DONE = b"data: [DONE]\n\n"


def text(tokens: int) -> str:
    """The generated text: one word per token."""
    return "".join(itertools.islice(itertools.cycle(WORDS), tokens))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    kind: Kind,
    response_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    tokens: int,
    content: str | None = None,
) -> bytes:
    """A whole non-streamed `chat.completion` or `text_completion`; `content`, when
    given, is the whole answer (a scripted one, which stops by itself)."""
    choice: dict[str, object] = {"index": 0}
    answer = text(tokens) if content is None else content
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": answer}
    else:
        choice["text"] = answer
    choice["logprobs"] = None
    choice["finish_reason"] = "length" if content is None else "stop"
    return orjson.dumps(
        {
            "id": response_id,
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage(prompt_tokens, tokens),
        }
    )


def embedding_body(model: str, inputs: tuple[str, ...], prompt_tokens: int, b64: bool) -> bytes:
    data = [
        {"object": "embedding", "index": index, "embedding": _embedding(value, b64)}
        for index, value in enumerate(inputs)
    ]
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    )


def _embedding(value: str, b64: bool) -> list[float] | str:
    """A deterministic vector in [-1, 1) derived from a hash of the input."""
    digest = hashlib.blake2b(value.encode(), digest_size=2 * _EMBEDDING_SIZE).digest()
    vector = [part / 32768 - 1 for part in struct.unpack(f"<{_EMBEDDING_SIZE}H", digest)]
    if b64:
        return base64.b64encode(struct.pack(f"<{_EMBEDDING_SIZE}f", *vector)).decode()
    return vector


class StreamEvents:
    """The SSE events of one streamed response, one `data:` event per token."""

    __slots__ = ("_final", "_head", "_tokens", "opening")

    def __init__(self, kind: Kind, response_id: str, created: int, model: str) -> None:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        head = orjson.dumps({"id": response_id, "object": obj, "created": created, "model": model})
        self._head = head[:-1]
        prefix = b"data: " + self._head + b',"choices":[{"index":0,'
        open_token, close_token = (
            (b'"delta":{"content":', b"}") if kind == "chat" else (b'"text":', b"")
        )
        tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self._tokens = tuple(
            prefix + open_token + word + close_token + tail for word in _WORDS_JSON
        )
        if kind == "chat":
            self.opening = prefix + b'"delta":{"role":"assistant","content":""}' + tail
            last = b'"delta":{}'
        else:
            self.opening = b""
            last = b'"text":""'
        self._final = prefix + last + b',"logprobs":null,"finish_reason":"length"}]}\n\n'

    def tokens(self, start: int, stop: int) -> bytes:
        """Events for tokens start..stop-1, joined so a late consumer writes them in one send."""
        pieces = self._tokens
        size = len(pieces)
        return b"".join([pieces[index % size] for index in range(start, stop)])

    def closing(
        self, token_usage: dict[str, int] | None, timing: dict[str, float] | None = None
    ) -> bytes:
        """The finish event, the usage event when asked for, and the `[DONE]` sentinel.

        `timing` rides on the usage event as `sim_timing` (unknown fields are ignored by
        the SDKs), so a benchmark behind a gateway learns the backend's own share of TTFT.
        """
        if token_usage is None:
            return self._final + _DONE
        usage_event = self._head + b',"choices":[],"usage":' + orjson.dumps(token_usage)
        if timing is not None:
            usage_event += b',"sim_timing":' + orjson.dumps(timing)
        usage_event += b"}"
        return self._final + b"data: " + usage_event + b"\n\n" + _DONE
