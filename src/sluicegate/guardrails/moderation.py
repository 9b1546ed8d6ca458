"""A checker that asks an OpenAI-moderation-compatible endpoint (OpenAI's own, or any
service that answers its shapes) about a text.

It posts `{"model", "input"}` and reads `results[0]`: `categories` (name -> bool) and
`category_scores` (name -> float). A category is hit when the endpoint says so, except
where config sets a threshold for it: then when its score reaches the threshold. Hit categories in
`block` flag the text; the others are still named in the verdict's categories, unflagged,
for the guardrail to audit. A moderation verdict covers the whole text, so it has no
spans: it blocks, it cannot mask. Every call is bounded (a total timeout, a cap on the
answer's size), and any failure raises, for the guardrail's failure mode to decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
import orjson

from sluicegate.guardrails.checker import PASSED, Stage, Verdict

MAX_ANSWER_BYTES = 1 << 20


class ModerationError(Exception):
    """The endpoint failed or answered something that is not a moderation result."""


class ModerationChecker:
    """Asks the endpoint at `url`; flags hits in `block` (None: any hit)."""

    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key: str | None = None,
        block: Iterable[str] | None = None,
        thresholds: Mapping[str, float] | None = None,
        timeout_s: float = 5.0,
        name: str = "moderation",
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"moderation url must be http:// or https://, not {url!r}")
        if timeout_s <= 0:
            raise ValueError(f"moderation timeout_s must be positive, not {timeout_s!r}")
        for category, value in (thresholds or {}).items():
            if not 0 <= value <= 1:
                raise ValueError(f"moderation threshold for {category!r} must be in [0, 1]")
        self.name = name
        self._url = url
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._block = None if block is None else frozenset(block)
        self._thresholds = dict(thresholds or {})
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def check(self, text: str, stage: Stage) -> Verdict:
        result = _result(await self._post({"input": text} | self._model_field()))
        hits = sorted(self._hits(result))
        if not hits:
            return PASSED
        blocked = any(self._block is None or hit in self._block for hit in hits)
        return Verdict(blocked, (), tuple(hits))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _model_field(self) -> dict[str, str]:
        return {} if self._model is None else {"model": self._model}

    def _hits(self, result: Mapping[str, Any]) -> Iterable[str]:
        categories = result.get("categories") or {}
        scores = result.get("category_scores") or {}
        if not isinstance(categories, dict) or not isinstance(scores, dict):
            raise ModerationError("categories and category_scores must be objects")
        for category, hit in categories.items():
            if hit is True and category not in self._thresholds:
                yield category
        for category, threshold in self._thresholds.items():
            score = scores.get(category)
            if isinstance(score, int | float) and score >= threshold:
                yield category

    async def _post(self, body: dict[str, str]) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        async with self._session.post(
            self._url, data=orjson.dumps(body), headers=self._headers | _JSON
        ) as response:
            raw = await _bounded(response.content)
            if response.status != 200:
                raise ModerationError(f"moderation endpoint answered {response.status}")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ModerationError(f"moderation answer is not JSON: {exc}") from None


_JSON = {"Content-Type": "application/json"}


async def _bounded(content: aiohttp.StreamReader) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for part in content.iter_chunked(65536):
        size += len(part)
        if size > MAX_ANSWER_BYTES:
            raise ModerationError(f"moderation answer is over {MAX_ANSWER_BYTES} bytes")
        parts.append(part)
    return b"".join(parts)


def _result(answer: Any) -> Mapping[str, Any]:
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or not results or not isinstance(results[0], dict):
        raise ModerationError("moderation answer has no results[0] object")
    return results[0]
