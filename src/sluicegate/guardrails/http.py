"""A checker that asks a team's own classifier over HTTP (contract in docs/guardrails.md).

It POSTs `{"text", "stage", "guardrail"}` as JSON and reads `{"flagged", "spans",
"categories"}`. Anything else (a status that is not 200, a body that is not that
shape or larger than `MAX_ANSWER_BYTES`, spans outside the text) is the classifier's
failure, raised for the guardrail to turn into its failure mode. As each provider's
transport does, it keeps one pooled session with its own connection limit, follows no
redirect, keeps no cookies and asks for no compression; the guardrail's budget bounds
each call.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
import orjson

from sluicegate.guardrails.checker import Span, Stage, Verdict

MAX_ANSWER_BYTES = 256 * 1024
MAX_CONNECTIONS = 64


class CheckerFailed(Exception):
    """The classifier answered, but not as the contract says."""


class HttpChecker:
    def __init__(self, name: str, url: str, headers: Mapping[str, str] | None = None) -> None:
        self.name = name
        self._url = url
        self._headers = {"content-type": "application/json", "accept-encoding": "identity"}
        self._headers.update(headers or {})
        self._session: aiohttp.ClientSession | None = None

    def _opened(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0),
                headers=self._headers,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def check(self, text: str, stage: Stage) -> Verdict:
        body = orjson.dumps({"text": text, "stage": stage.value, "guardrail": self.name})
        async with self._opened().post(self._url, data=body, allow_redirects=False) as response:
            if response.status != 200:
                raise CheckerFailed(f"the classifier answered {response.status}")
            parts: list[bytes] = []
            size = 0
            async for part in response.content.iter_any():
                size += len(part)
                if size > MAX_ANSWER_BYTES:
                    raise CheckerFailed(f"the classifier's answer is over {MAX_ANSWER_BYTES} bytes")
                parts.append(part)
        return verdict_of(b"".join(parts), len(text))


def verdict_of(raw: bytes, length: int) -> Verdict:
    """The verdict an answer carries, held to the contract."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise CheckerFailed("the classifier's answer is not JSON") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("flagged"), bool):
        raise CheckerFailed("the classifier's answer has no boolean 'flagged'")
    spans = tuple(sorted((_span(s, length) for s in answer.get("spans") or ()), key=_start))
    categories = answer.get("categories") or []
    if not isinstance(categories, list) or not all(isinstance(c, str) for c in categories):
        raise CheckerFailed("the classifier's 'categories' is not a list of strings")
    if spans and not answer["flagged"]:
        raise CheckerFailed("the classifier gave spans but did not flag the text")
    return Verdict(answer["flagged"], spans, tuple(categories))


def _span(raw: object, length: int) -> Span:
    if not isinstance(raw, dict):
        raise CheckerFailed("a span is not an object")
    start, end, kind = raw.get("start"), raw.get("end"), raw.get("kind")
    if not (isinstance(start, int) and isinstance(end, int) and isinstance(kind, str) and kind):
        raise CheckerFailed("a span needs integer start and end and a kind")
    if not 0 <= start < end <= length:
        raise CheckerFailed(f"a span [{start}, {end}) is outside the text")
    return Span(start, end, kind)


def _start(span: Span) -> int:
    return span.start
