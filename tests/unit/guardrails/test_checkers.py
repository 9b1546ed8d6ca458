"""The HTTP and plug-in checkers pass the one functional test every checker passes; the
HTTP one holds a classifier to its JSON contract."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from sluicegate.core.guarding import (
    Action,
    CheckerSpec,
    GuardrailSpec,
    Placement,
    default_failure,
)
from sluicegate.guardrails.cache import DecisionCache
from sluicegate.guardrails.checker import Stage
from sluicegate.guardrails.guard import Guardrail, Outcome
from sluicegate.guardrails.http import CheckerFailed, HttpChecker, verdict_of
from sluicegate.guardrails.patterns import Patterns
from sluicegate.guardrails.plugin import PluginError, load_plugin
from tests.support.clock import FakeClock
from tests.support.webapp import serving
from tests.unit.guardrails.contract import check_contract

EMAIL = r"[\w.]+@[\w.]+\.\w+"
FLAGGED = ["mail bob@example.com now", "a@b.co and c@d.org"]
CLEAN = ["nothing to see here", "at sign @ alone"]


async def classify(request: web.Request) -> web.Response:
    """A team's classifier as the contract describes it: finds e-mail addresses."""
    asked = await request.json()
    text = asked["text"]
    spans = [
        {"start": m.start(), "end": m.end(), "kind": "email"} for m in re.finditer(EMAIL, text)
    ]
    answer = {"flagged": bool(spans), "spans": spans, "categories": ["pii"] if spans else []}
    return web.json_response(answer)


async def down(request: web.Request) -> web.Response:
    return web.Response(status=503)


async def odd(request: web.Request) -> web.Response:
    return web.Response(text="yes")


async def huge(request: web.Request) -> web.StreamResponse:
    """A classifier that streams an answer over the bound, in small pieces."""
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b'{"flagged": false, "categories": [')
    for _ in range(20_000):
        await response.write(b'"xxxxxxxxxxxxxxxxxx",')
    await response.write(b'"x"]}')
    return response


async def in_pieces(request: web.Request) -> web.StreamResponse:
    """A valid answer sent in two writes, the second after the first has left."""
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b'{"flagged": true, ')
    await asyncio.sleep(0.05)
    await response.write(b'"categories": ["pii"]}')
    return response


async def stalled(request: web.Request) -> web.Response:
    """A classifier that never answers in time (the test ends it)."""
    await asyncio.sleep(30)
    return web.json_response({"flagged": False})


@pytest.fixture
async def classifier() -> AsyncIterator[str]:
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/check", classify)
    app.router.add_post("/down", down)
    app.router.add_post("/odd", odd)
    app.router.add_post("/stalled", stalled)
    app.router.add_post("/huge", huge)
    app.router.add_post("/pieces", in_pieces)
    async with serving(app) as url:
        yield url


async def test_the_http_checker_passes_the_checker_contract(classifier: str) -> None:
    checker = HttpChecker("emails", f"{classifier}/check")
    try:
        await check_contract(checker, FLAGGED, CLEAN)
        verdict = await checker.check("x bob@example.com", Stage.OUTPUT)
        assert verdict.categories == ("pii",)
    finally:
        await checker.close()


@pytest.mark.parametrize("path", ["/down", "/odd", "/huge"])
async def test_a_classifier_off_contract_raises(classifier: str, path: str) -> None:
    checker = HttpChecker("emails", f"{classifier}{path}")
    try:
        with pytest.raises(CheckerFailed):
            await checker.check("text", Stage.INPUT)
    finally:
        await checker.close()


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"flagged": "yes"},
        {"flagged": True, "spans": [{"start": 0, "end": 99, "kind": "x"}]},
        {"flagged": True, "spans": [{"start": 2, "end": 1, "kind": "x"}]},
        {"flagged": True, "spans": [{"start": 0, "end": 1}]},
        {"flagged": False, "spans": [{"start": 0, "end": 1, "kind": "x"}]},
        {"flagged": True, "categories": "pii"},
        [1, 2],
    ],
)
def test_answers_off_contract_are_refused(answer: object) -> None:
    with pytest.raises(CheckerFailed):
        verdict_of(orjson.dumps(answer), 10)


def test_spans_are_sorted_by_start() -> None:
    raw = orjson.dumps(
        {
            "flagged": True,
            "spans": [{"start": 5, "end": 6, "kind": "b"}, {"start": 1, "end": 2, "kind": "a"}],
        }
    )
    assert [s.start for s in verdict_of(raw, 10).spans] == [1, 5]


async def test_a_plugin_is_built_from_its_path_and_passes_the_contract() -> None:
    checker = load_plugin(
        "sluicegate.guardrails.patterns:Patterns", {"patterns": {"email": EMAIL}}, "g"
    )
    assert isinstance(checker, Patterns)
    await check_contract(checker, FLAGGED, CLEAN)


@pytest.mark.parametrize(
    ("path", "options", "expected"),
    [
        ("no.such.module:X", {}, "cannot import"),
        ("sluicegate.guardrails.patterns:Nope", {}, "has no class"),
        ("sluicegate.guardrails.patterns:Patterns", {"wrong": 1}, "could not be built"),
        ("sluicegate.guardrails.checker:Span", {"start": 0, "end": 1, "kind": "x"}, "no check"),
    ],
)
def test_a_plugin_that_cannot_be_built_names_the_guardrail(
    path: str, options: dict, expected: str
) -> None:
    with pytest.raises(PluginError) as caught:
        load_plugin(path, options, "mine")
    assert expected in str(caught.value)
    assert "'mine'" in str(caught.value)


def over_http(clock: FakeClock, url: str, action: Action) -> Guardrail:
    spec = GuardrailSpec(
        "remote",
        CheckerSpec("http", {"url": url}, 0.25),
        action,
        Placement.PRE_CALL,
        default_failure(action),
        cache_ttl_s=0,
    )
    cache = DecisionCache(clock, b"s", "remote", "v", 0, 0)
    return Guardrail(spec, HttpChecker("remote", url), clock, cache)


@pytest.mark.parametrize(
    ("action", "expected"),
    [(Action.BLOCK, Outcome.FAILED_CLOSED), (Action.AUDIT, Outcome.FAILED_OPEN)],
)
async def test_a_stalled_classifier_is_given_up_at_the_budget(
    classifier: str, action: Action, expected: Outcome
) -> None:
    clock = FakeClock()
    guardrail = over_http(clock, f"{classifier}/stalled", action)
    try:
        deciding = asyncio.ensure_future(guardrail.check("hello", Stage.INPUT))
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not deciding.done()
        clock.advance(0.2)
        await asyncio.sleep(0.01)
        assert not deciding.done(), "not before its budget"
        clock.advance(0.05)
        decision = await asyncio.wait_for(deciding, 5)
        assert decision.outcome is expected
    finally:
        await guardrail._checker.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("action", "expected"),
    [(Action.MASK, Outcome.FAILED_CLOSED), (Action.AUDIT, Outcome.FAILED_OPEN)],
)
async def test_a_failing_classifier_decides_at_once(
    classifier: str, action: Action, expected: Outcome
) -> None:
    clock = FakeClock()
    guardrail = over_http(clock, f"{classifier}/down", action)
    try:
        decision = await guardrail.check("hello", Stage.INPUT)
        assert decision.outcome is expected
        assert clock.now() == 1000.0
    finally:
        await guardrail._checker.close()  # type: ignore[attr-defined]


async def test_an_answer_that_arrives_in_pieces_is_read_whole(classifier: str) -> None:
    checker = HttpChecker("pieces", f"{classifier}/pieces")
    try:
        verdict = await checker.check("text", Stage.INPUT)
        assert verdict.flagged
        assert verdict.categories == ("pii",)
    finally:
        await checker.close()
