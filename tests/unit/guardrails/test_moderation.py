"""The moderation checker against a small local server that answers the endpoint's shapes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from sluicegate.guardrails.checker import Stage
from sluicegate.guardrails.moderation import MAX_ANSWER_BYTES, ModerationChecker, ModerationError
from tests.support.webapp import serving
from tests.unit.guardrails.contract import check_contract

CATEGORIES = ("harassment", "hate", "self-harm", "sexual", "violence")


class Endpoint:
    """Flags `violence` for texts with "kill", `harassment` for texts with "idiot"; a
    text with "score" gets violence at 0.4 unflagged; "fail", "slow", "huge", "junk"
    misbehave."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, Any], str | None]] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((body, request.headers.get("Authorization")))
        text = body["input"]
        if "fail" in text:
            return web.Response(status=500, text="down")
        if "slow" in text:
            await asyncio.wait_for(self.release.wait(), 5)
        if "huge" in text:  # valid JSON, but past the cap
            return web.Response(body=b'{"results": [{}]}' + b" " * MAX_ANSWER_BYTES)
        if "junk" in text:
            return web.json_response({"results": []})
        hits = {"violence": "kill" in text, "harassment": "idiot" in text}
        categories = {name: hits.get(name, False) for name in CATEGORIES}
        scores = {name: 0.9 if categories[name] else 0.01 for name in CATEGORIES}
        if "score" in text:
            scores["violence"] = 0.4
        result = {"flagged": any(categories.values()), "categories": categories,
                  "category_scores": scores}  # fmt: skip
        return web.json_response({"id": "modr-1", "model": body.get("model"), "results": [result]})


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[Endpoint, str]]:
    scripted = Endpoint()
    app = web.Application()
    app.router.add_post("/v1/moderations", scripted.handle)
    async with serving(app) as url:
        yield scripted, f"{url}/v1/moderations"
        scripted.release.set()


async def test_the_moderation_checker_keeps_the_checkers_promises(endpoint) -> None:
    _, url = endpoint
    checker = ModerationChecker(url)
    await check_contract(checker, ["I will kill it", "you idiot"], ["hello there", "a b"])
    await checker.close()


async def test_it_posts_the_endpoints_request_shape(endpoint) -> None:
    scripted, url = endpoint
    checker = ModerationChecker(url, model="omni-moderation-latest", api_key="sk-test")
    await checker.check("hello", Stage.INPUT)
    await checker.close()
    assert scripted.seen == [
        ({"input": "hello", "model": "omni-moderation-latest"}, "Bearer sk-test")
    ]


async def test_blocked_categories_flag_and_the_others_are_named_for_audit(endpoint) -> None:
    _, url = endpoint
    checker = ModerationChecker(url, block=["violence"])
    blocked = await checker.check("kill you idiot", Stage.INPUT)
    audited = await checker.check("you idiot", Stage.INPUT)
    await checker.close()
    assert (blocked.flagged, blocked.categories) == (True, ("harassment", "violence"))
    assert (audited.flagged, audited.categories) == (False, ("harassment",))


async def test_a_threshold_decides_its_category_from_the_score(endpoint) -> None:
    _, url = endpoint
    strict = ModerationChecker(url, thresholds={"violence": 0.3})
    lax = ModerationChecker(url, thresholds={"violence": 0.95})
    assert (await strict.check("a score", Stage.INPUT)).categories == ("violence",)
    assert not (await lax.check("kill", Stage.INPUT)).flagged
    await strict.close()
    await lax.close()


@pytest.mark.parametrize("text", ["fail", "huge", "junk", "slow"])
async def test_a_failing_or_unreadable_endpoint_raises(endpoint, text: str) -> None:
    _, url = endpoint
    checker = ModerationChecker(url, timeout_s=0.5)
    with pytest.raises((ModerationError, TimeoutError)):
        await checker.check(text, Stage.INPUT)
    await checker.close()


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="url"):
        ModerationChecker("ftp://x")
    with pytest.raises(ValueError, match="timeout_s"):
        ModerationChecker("http://x", timeout_s=0)
    with pytest.raises(ValueError, match="'hate'"):
        ModerationChecker("http://x", thresholds={"hate": 2})
