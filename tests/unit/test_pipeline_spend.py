"""Spend on the pipeline's path, with scripted providers and a fake clock: what each
attempt costs, budgets refusing before any model call, and a cut stream's estimate."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.spend.prices import NANOS
from tests.unit.test_pipeline import config, driven, running, settle

PRICE = {"input": 1000.0, "output": 2000.0, "batch_discount": 0.5}
"""$0.001 an input token and $0.002 an output token: the scripted answer (7 tokens used,
2 of them output) costs 5 x 1 + 2 x 2 = $0.009."""
ANSWER = 9 * NANOS // 1000


def spent(h) -> dict:
    return h.runtime.pipeline.spend.book.view(h.runtime.pipeline._settings.models)


async def test_an_answer_costs_its_usage_at_its_deployments_price():
    raw = config({"name": "a", "price": PRICE}, {"name": "b"})
    async with running(raw, {}) as h:
        await h.ask(h.inbound())
        view = spent(h)
        assert view["tenants"]["a"]["chat"]["nanos"] == ANSWER
        assert view["unpriced_deployments"] == "b"
        lanes = h.runtime.pipeline.slo.view()["models"]["chat"]
        assert lanes["default"]["cost_per_success_dollars"] == ANSWER / NANOS


async def test_a_job_pays_the_batch_price():
    async with running(config({"name": "a", "price": PRICE}), {}) as h:
        await h.ask(h.inbound(interactive=False))
        assert spent(h)["tenants"]["a"]["chat"]["nanos"] == ANSWER // 2


async def test_only_the_attempt_that_answered_is_billed_after_a_failure():
    raw = config({"name": "a", "price": PRICE}, {"name": "b", "price": PRICE})
    async with running(raw, {"a": "fail"}) as h:
        await driven(h.clock, asyncio.ensure_future(h.ask(h.inbound())))
        assert spent(h)["tenants"]["a"]["chat"]["attempts"] == 1


async def test_nothing_is_counted_when_nothing_is_priced():
    async with running(config({"name": "a"}), {}) as h:
        assert h.runtime.pipeline.spend is None
        await h.ask(h.inbound())


async def test_a_request_over_budget_is_refused_before_any_model_call():
    # Each request reserves 100 output tokens at $0.002 ($0.2) and its prompt, and
    # spends $0.009: after a few, $0.25 has no room for another reservation.
    budget = {"budgets": [{"tenant": "a", "amount": 0.25, "period": "daily"}]}
    async with running(config({"name": "a", "price": PRICE}, spend=budget), {}) as h:
        for _ in range(6):
            await h.ask(h.inbound(max_tokens=100))
        with pytest.raises(GatewayError) as refused:
            await h.ask(h.inbound(max_tokens=100))
        err = refused.value
        assert (err.status, err.code, err.should_retry) == (429, "budget_exceeded", False)
        assert err.retry_after_s is not None
        assert 0 < err.retry_after_s <= 86400
        answered = len(h.providers["a"].bodies)
        assert answered == 6, "refused before any model call"
        assert spent(h)["tenants"]["a"]["chat"]["nanos"] == answered * ANSWER
        await h.ask(h.inbound(max_tokens=10))


async def test_a_stream_cut_before_its_usage_counts_its_prompt_and_what_was_relayed():
    async with running(config({"name": "a", "price": PRICE}), {}) as h:
        async with h.runtime.pipeline.run(h.inbound(stream=True)) as answer:
            async for _ in answer.chunks():
                break
        await settle()
        row = spent(h)["tenants"]["a"]["chat"]
        assert row["output_tokens"] == 1
        assert row["estimated_nanos"] == row["nanos"] > 0


async def test_a_request_refused_over_budget_gives_its_token_reservations_back():
    """The aggregate's tokens per minute (400) hold about four requests' reservations
    (about 105 tokens each) at once: were refusals to keep theirs, other tenants would
    soon be refused for capacity."""
    budget = {"budgets": [{"tenant": "a", "amount": 0.001, "period": "daily"}]}
    raw = config({"name": "a", "price": PRICE}, spend=budget)
    raw["aggregate"] = {"tokens_per_minute": 400}
    async with running(raw, {}) as h:
        codes = []
        for _ in range(8):
            with pytest.raises(GatewayError) as refused:
                await h.ask(h.inbound(max_tokens=100))
            codes.append(refused.value.code)
        assert codes == ["budget_exceeded"] * 8
