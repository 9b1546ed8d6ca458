"""Every finished request judged once against its lane's SLOs and counted, on a fake
clock: in the Prometheus families and in the recent window `/admin/status` shows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.app import Runtime
from sluicegate.core.clock import sleep_until
from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Endpoint
from tests.support.fakes import ScriptedProvider
from tests.unit.test_pipeline import Harness, config, driven, running, settle

LANES = {
    "lanes": [
        {
            "name": "chat",
            "priority": 100,
            "ttft_slo_s": 1.0,
            "tpot_slo_s": 0.1,
            "e2e_slo_s": 10.0,
            "queue_size": 4,
            "max_queue_age_s": 2.0,
        }
    ]
}


def outcomes(runtime: Runtime) -> dict[tuple[str, str, str], float]:
    """`sluicegate_request_outcomes_total` by (lane, outcome, kind)."""
    found: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(runtime.metrics.exposition().decode()):
        if family.name == "sluicegate_request_outcomes":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    labels = sample.labels
                    key = (labels["lane"], labels["outcome"], labels["kind"])
                    found[key] = found.get(key, 0) + sample.value
    return found


def recent(runtime: Runtime) -> dict[str, Any]:
    """The window's figures for the `chat` lane of the model `chat`."""
    return runtime.pipeline.slo.view()["models"]["chat"]["chat"]


async def ask(h: Harness, **body: Any) -> bytes:
    task = asyncio.ensure_future(h.ask(h.inbound(**body)))
    return await driven(h.clock, task, step_s=0.05)


class Decoding:
    """A stream of an opening and `tokens` tokens, `gap_s` apart on the fake clock, whose
    usage reports them."""

    def __init__(self, clock: Any, tokens: int, gap_s: float) -> None:
        self._clock, self._tokens, self._gap_s = clock, tokens, gap_s
        self.used_tokens: int | None = None
        self.completion_tokens: int | None = None

    async def read(self) -> bytes:
        raise AssertionError("a stream is never read whole")

    async def chunks(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
        for i in range(self._tokens):
            if i:
                await sleep_until(self._clock, self._clock.now() + self._gap_s)
            yield b'data: {"choices":[{"index":0,"delta":{"content":"w "}}]}\n\n'
        yield b"data: [DONE]\n\n"
        self.used_tokens, self.completion_tokens = 10 + self._tokens, self._tokens


class DecodingProvider(ScriptedProvider):
    tokens, gap_s = 5, 0.0

    @asynccontextmanager
    async def open(
        self, endpoint: Endpoint, payload: dict[str, Any], budget_s: float
    ) -> AsyncIterator[Decoding]:
        assert self.clock is not None
        yield Decoding(self.clock, self.tokens, self.gap_s)


async def streamed(h: Harness, tokens: int, gap_s: float) -> None:
    provider = DecodingProvider(h.providers["a"].deployment)
    provider.clock, provider.tokens, provider.gap_s = h.clock, tokens, gap_s
    h.runtime.pipeline._providers["a"] = provider

    async def whole() -> None:
        async with h.runtime.pipeline.run(h.inbound(stream=True)) as answer:
            async for _ in answer.chunks():
                pass

    await driven(h.clock, asyncio.ensure_future(whole()), step_s=0.05)


async def test_an_answer_within_every_slo_is_met_and_counted_for_its_tenant_too():
    async with running(config({"name": "a"}, scheduling=LANES), {}) as h:
        await ask(h)
        assert outcomes(h.runtime) == {("chat", "met", "met"): 1}
        assert recent(h.runtime)["met"] == 1
        assert recent(h.runtime)["attainment"] == 1.0
        tenant = h.runtime.pipeline.slo.view()["tenants"]["a"]["chat"]
        assert (tenant["offered"], tenant["met"]) == (1, 1)


async def test_a_slow_first_token_misses_the_ttft_slo():
    async with running(config({"name": "a"}, scheduling=LANES), {"a": "slow"}) as h:
        h.providers["a"].clock, h.providers["a"].delay_s = h.clock, 1.5
        await ask(h)
        assert outcomes(h.runtime) == {("chat", "ttft_missed", "missed"): 1}
        assert recent(h.runtime)["attainment"] == 0.0


async def test_a_slow_decode_misses_the_tpot_slo_and_a_quick_one_meets_it():
    async with running(config({"name": "a"}, scheduling=LANES), {}) as h:
        await streamed(h, tokens=5, gap_s=0.5)
        await streamed(h, tokens=5, gap_s=0.0)
        assert outcomes(h.runtime) == {
            ("chat", "tpot_missed", "missed"): 1,
            ("chat", "met", "met"): 1,
        }


async def test_a_refusal_is_offered_but_not_accepted():
    raw = config({"name": "a"}, scheduling={"lanes": [{**LANES["lanes"][0], "queue_size": 0}]})
    raw["pools"][0]["max_concurrency"] = 1
    async with running(raw, {"a": "hang"}) as h:
        holder = asyncio.ensure_future(h.ask(h.inbound()))
        await settle()
        with pytest.raises(GatewayError):
            await ask(h)
        assert outcomes(h.runtime) == {("chat", "pool_concurrency_limited", "refused"): 1}
        shown = recent(h.runtime)
        assert (shown["offered"], shown["accepted"], shown["attainment"]) == (1, 0, None)
        holder.cancel()
        await settle()


async def test_a_refusal_before_the_lane_is_known_counts_for_no_lane():
    lanes = {"lanes": [{**LANES["lanes"][0], "max_prompt_tokens": 1}]}
    async with running(config({"name": "a"}, scheduling=lanes), {}) as h:
        with pytest.raises(GatewayError):
            await ask(h, messages=[{"role": "user", "content": "a prompt of many tokens"}])
        assert outcomes(h.runtime) == {("-", "prompt_too_long", "refused"): 1}


async def test_a_request_that_expires_in_its_queue_is_refused_as_expired():
    raw = config({"name": "a"}, scheduling=LANES)
    raw["pools"][0]["max_concurrency"] = 1
    async with running(raw, {"a": "hang"}) as h:
        holder = asyncio.ensure_future(h.ask(h.inbound()))
        await settle()
        with pytest.raises(GatewayError) as refused:
            await ask(h)
        assert refused.value.code == "expired"
        holder.cancel()
        await settle()
        found = outcomes(h.runtime)
        assert found[("chat", "expired", "refused")] == 1


async def test_a_failure_after_a_fallback_is_accepted_and_failed():
    raw = config({"name": "a"}, {"name": "b"}, route={"retry": {"max_attempts": 2}})
    raw["scheduling"] = LANES
    async with running(raw, {"a": "fail", "b": "fail"}) as h:
        with pytest.raises(GatewayError) as failed:
            await ask(h)
        assert outcomes(h.runtime) == {("chat", failed.value.code, "failed"): 1}
        shown = recent(h.runtime)
        assert (shown["accepted"], shown["failed"], shown["attainment"]) == (1, 1, 0.0)


@pytest.mark.parametrize(("left_after_s", "verdict"), [(0.5, "abandoned"), (1.5, "ttft_missed")])
async def test_a_caller_who_leaves_missed_the_ttft_only_once_it_had_passed(left_after_s, verdict):
    async with running(config({"name": "a"}, scheduling=LANES), {"a": "hang"}) as h:
        task = asyncio.ensure_future(h.ask(h.inbound()))
        await settle()
        h.clock.advance(left_after_s)
        task.cancel()
        await settle()
        ((lane, outcome, _),) = outcomes(h.runtime)
        assert (lane, outcome) == ("chat", verdict)
