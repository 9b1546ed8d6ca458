"""The pipeline's request lifecycle, with scripted providers and a fake clock.

Each test here once failed: attempts shared one mutable request, so a fallback sent the
previous deployment's fields, a hedge orphaned its first attempt or settled the
loser's reservation with the winner's usage, and a cancelled probe closed a circuit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from sluicegate.app import Runtime, build
from sluicegate.capacity.breaker import BreakerState
from sluicegate.config.loader import parse_settings
from sluicegate.core.clock import sleep_until
from sluicegate.core.errors import GatewayError
from sluicegate.core.limits import LimitStore
from sluicegate.core.types import Endpoint
from sluicegate.pipeline import Inbound
from sluicegate.stores.memory import MemoryLimitStore
from tests.support.clock import FakeClock
from tests.support.fakes import ScriptedProvider, UnreachableStore, YieldingStore

ENV = {"A_KEY": "sk-a"}


def config(*deployments: dict, route: dict | None = None, **top: Any) -> dict:
    return {
        "routes": {"chat": {"max_output_tokens": 100, **(route or {})}},
        "pools": [{"name": d["name"], "max_concurrency": 4} for d in deployments],
        "models": [
            {
                "name": "chat",
                "strategy": "fallback",
                "deployments": [
                    {
                        "base_url": "http://127.0.0.1:9/v1",
                        "model": "m",
                        "pools": [d["name"]],
                        **d,
                    }
                    for d in deployments
                ],
            }
        ],
        "tenants": [{"name": "a", "keys": [{"env": "A_KEY"}]}],
        **top,
    }


@dataclass
class Harness:
    runtime: Runtime
    clock: FakeClock
    providers: dict[str, ScriptedProvider]

    def inbound(self, lane: str | None = None, interactive: bool = True, **body: Any) -> Inbound:
        payload = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **body}

        async def read() -> dict[str, Any]:
            return payload

        tenant = self.runtime.pipeline._settings.tenants[0]
        return Inbound(
            Endpoint.CHAT, tenant, self.clock.now(), read, lane=lane, interactive=interactive
        )

    async def ask(self, inbound: Inbound) -> bytes:
        async with self.runtime.pipeline.run(inbound) as answer:
            return await answer.read()

    def active(self, pool: str) -> int:
        return self.runtime.pools[pool].counters.active


@asynccontextmanager
async def running(
    raw: dict, modes: dict[str, str], store: LimitStore | None = None
) -> AsyncIterator[Harness]:
    clock = FakeClock()
    settings = parse_settings(raw, "test", ENV)
    providers = {
        d.name: ScriptedProvider(d, modes.get(d.name, "answer"))
        for model in settings.models.values()
        for d in model.deployments
    }
    runtime = build(settings, clock, providers, store)
    tasks = [asyncio.create_task(d.run()) for d in runtime.dispatchers.values()]
    try:
        yield Harness(runtime, clock, providers)
    finally:
        for task in tasks:
            assert not task.done(), task
            task.cancel()


async def settle(rounds: int = 10) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def driven(clock: FakeClock, task: asyncio.Future[Any], step_s: float = 0.05) -> Any:
    """Await `task`, moving the fake clock on while it waits (backoffs, hedge delays)."""
    for _ in range(2000):
        await settle()
        if task.done():
            return task.result()
        clock.advance(step_s)
    raise AssertionError("the task did not finish")


async def test_a_fallback_attempt_sends_a_body_built_for_its_own_deployment():
    """`a` takes vLLM priorities and fails; `b` would refuse a `priority` field."""
    raw = config(
        {"name": "a", "pass_priority": True},
        {"name": "b"},
        route={"retry": {"max_attempts": 2}},
        scheduling={
            "lanes": [
                {"name": "interactive", "priority": 100},
                {"name": "batch", "priority": 0},
            ]
        },
    )
    async with running(raw, {"a": "fail"}) as h:
        task = asyncio.ensure_future(h.ask(h.inbound(lane="batch")))
        await driven(h.clock, task)
        (sent_a,) = h.providers["a"].bodies
        (sent_b,) = h.providers["b"].bodies
        assert sent_a["priority"] == 100
        assert "priority" not in sent_b
        assert h.active("a") == h.active("b") == 0


ENGINE_STEERING = {
    "priority": -1000,
    "cache_salt": "another-tenants-salt",
    "request_id": "another-callers-id",
    "kv_transfer_params": {"remote_host": "10.0.0.1", "remote_port": 5600},
    "ec_transfer_params": {"remote_host": "10.0.0.1"},
}


@pytest.mark.parametrize("pass_priority", [False, True])
async def test_a_caller_cannot_steer_the_engine(pass_priority: bool):
    """Fields only the gateway may set never reach the deployment as the caller sent
    them: a `priority` of its own would jump other tenants' queue in vLLM."""
    raw = config({"name": "a", "pass_priority": pass_priority})
    async with running(raw, {}) as h:
        await h.ask(h.inbound(temperature=0.5, **ENGINE_STEERING))
        (sent,) = h.providers["a"].bodies
        assert sent["temperature"] == 0.5
        assert sent.get("priority") == (0 if pass_priority else None)
        assert not (ENGINE_STEERING.keys() - {"priority"}) & sent.keys()


@pytest.mark.parametrize(("isolate", "passes"), [(True, True), (True, False), (False, True)])
async def test_a_tenant_that_isolates_its_cache_sends_its_own_salt(isolate: bool, passes: bool):
    """Only to a deployment that takes it, never the caller's own, the same salt for
    every request of the tenant."""
    raw = config({"name": "a", "pass_cache_salt": passes})
    raw["tenants"][0]["isolate_cache"] = isolate
    async with running(raw, {}) as h:
        for _ in range(2):
            await h.ask(h.inbound(cache_salt="chosen-by-the-caller"))
        salts = {body.get("cache_salt") for body in h.providers["a"].bodies}
        assert "chosen-by-the-caller" not in salts
        if isolate and passes:
            (salt,) = salts
            assert isinstance(salt, str)
            assert len(salt) == 32
        else:
            assert salts == {None}


async def test_a_caller_gone_during_the_hedge_delay_leaves_no_attempt_behind():
    raw = config({"name": "a"}, {"name": "b"}, route={"hedge_after_s": 1})
    async with running(raw, {"a": "hang"}) as h:
        task = asyncio.ensure_future(h.ask(h.inbound()))
        await settle()
        assert h.providers["a"].open_calls == 1
        task.cancel()
        await settle()
        assert task.cancelled()
        h.clock.advance(5)
        await settle()
        assert h.providers["a"].open_calls == 0
        assert h.providers["a"].cancelled == 1
        assert h.providers["b"].bodies == []
        assert h.active("a") == 0


async def test_each_hedged_attempt_settles_its_own_reservation():
    """`a` never answers, so `b` wins with 7 tokens used: `a`'s pool learns nothing of
    those 7; its reservation stays unsettled, as for any attempt of unknown usage."""
    raw = config({"name": "a"}, {"name": "b"}, route={"hedge_after_s": 1})
    async with running(raw, {"a": "hang"}) as h:
        task = asyncio.ensure_future(h.ask(h.inbound(max_tokens=50)))
        await driven(h.clock, task)
        await settle()
        a, b = h.runtime.pools["a"].counters, h.runtime.pools["b"].counters
        assert (b.tokens_used, b.tokens_unsettled) == (7, 0)
        assert a.tokens_used == 0
        assert a.tokens_unsettled == a.tokens_reserved > 0
        assert h.active("a") == h.active("b") == 0


async def test_a_hedge_is_not_judged_within_share_again():
    """The hedge is the same request: judged again, a request within its share counted
    twice among the protected arrivals (and the reserve's arrival rate)."""
    raw = config({"name": "a"}, {"name": "b"}, route={"hedge_after_s": 1})
    async with running(raw, {"a": "hang"}) as h:
        task = asyncio.ensure_future(h.ask(h.inbound(max_tokens=50)))
        await driven(h.clock, task)
        assert len(h.providers["b"].bodies) == 1, "the hedge was sent and answered"
        view = h.runtime.dispatchers["chat"].view()
        assert (view.protected_arrivals, view.protected_refused) == (1, {})


@pytest.mark.parametrize("mode", ["hang", "answer"])
async def test_an_abandoned_half_open_probe_is_no_evidence(mode):
    """The probe's caller leaves (`hang`) or its hedge loses after answering (`answer`
    with `b` first): the circuit stays half-open and the probe slot is free again."""
    raw = config(
        {"name": "a", "breaker": {"consecutive_failures": 1, "open_s": 1}},
        {"name": "b"},
        route={"hedge_after_s": 1} if mode == "answer" else {},
    )
    async with running(raw, {"a": "hang"}) as h:
        target = h.runtime.dispatchers["chat"].targets[0]
        breaker = target.breaker
        breaker.started()
        breaker.record(False)
        h.clock.advance(1)
        assert breaker.allows()
        assert breaker.state is BreakerState.HALF_OPEN
        task = asyncio.ensure_future(h.ask(h.inbound()))
        if mode == "hang":
            await settle()
            task.cancel()
            await settle()
        else:
            await driven(h.clock, task)
            await settle()
        assert breaker.state is BreakerState.HALF_OPEN
        assert breaker.in_flight == 0
        assert breaker.allows()


async def test_a_job_takes_its_tenants_slot_and_is_recorded_like_any_request():
    raw = config({"name": "a"})
    raw["tenants"][0]["limits"] = {"max_concurrency": 1}
    async with running(raw, {"a": "hang"}) as h:
        held = asyncio.ensure_future(h.ask(h.inbound()))
        await settle()
        with pytest.raises(GatewayError) as info:
            await asyncio.wait_for(h.ask(h.inbound(interactive=False)), 5)
        assert info.value.code == "tenant_concurrency_limited"
        registry = h.runtime.metrics.registry
        refused = registry.get_sample_value(
            "sluicegate_refusals_total",
            {"route": "chat", "reason": "tenant_concurrency_limited", "status": "429"},
        )
        assert refused == 1
        held.cancel()
        await settle()
        h.providers["a"].mode = "answer"
        assert await h.ask(h.inbound(interactive=False))
        upstream = registry.get_sample_value(
            "sluicegate_stage_seconds_count",
            {"route": "chat", "model": "chat", "lane": "default", "stage": "upstream"},
        )
        assert upstream == 1


async def test_an_unreachable_limit_store_is_a_clear_503_not_a_500():
    raw = config({"name": "a"})
    raw["tenants"][0]["limits"] = {"max_concurrency": 1}
    async with running(raw, {}, UnreachableStore()) as h:
        with pytest.raises(GatewayError) as info:
            await h.ask(h.inbound())
        assert (info.value.status, info.value.code) == (503, "limit_store_unavailable")
        assert h.providers["a"].bodies == []


class FailsAfterAdmission(UnreachableStore):
    """Admits, then goes away: the request must still end cleanly."""

    def __init__(self, inner: LimitStore) -> None:
        self.inner = inner

    async def take(self, ask, lease, ttl_s):
        return await self.inner.take(ask, lease, ttl_s)


async def test_a_limit_store_lost_mid_request_does_not_fail_the_answer():
    raw = config({"name": "a"})
    raw["tenants"][0]["limits"] = {"max_concurrency": 1, "tokens_per_minute": 100000}
    store = FailsAfterAdmission(MemoryLimitStore(FakeClock()))
    async with running(raw, {}, store) as h:
        assert await h.ask(h.inbound(max_tokens=10))


async def test_n_and_best_of_multiply_the_output_reservation():
    """300 tokens a choice is within 1,000 a minute; four choices of it are not."""
    raw = config({"name": "a"})
    raw["tenants"][0]["limits"] = {"tokens_per_minute": 1000}
    async with running(raw, {}) as h:
        await h.ask(h.inbound(max_tokens=300))
        for many in ({"n": 4}, {"best_of": 4}):
            with pytest.raises(GatewayError) as info:
                await h.ask(h.inbound(max_tokens=300, **many))
            assert info.value.code == "tenant_token_limited"
            assert info.value.should_retry is False
        assert len(h.providers["a"].bodies) == 1


async def test_the_routes_prompt_budget_is_held_to_what_the_caller_sent_not_the_trimmed_prompt():
    """Degraded, the ladder would trim this prompt to fit the route's budget; the budget
    judges the request as sent, before any rewrite spends work on it."""
    raw = config(
        {"name": "a"},
        route={"max_prompt_tokens": 20},
        scheduling={"overload": {"ladder": {"trim_prompt_tokens": 10}}},
    )
    turns = [{"role": "user", "content": "x" * 40} for _ in range(3)]
    async with running(raw, {}) as h:
        h.runtime.pipeline._overload.observe([0.75])
        with pytest.raises(GatewayError) as info:
            await h.ask(h.inbound(messages=turns))
        assert (info.value.status, info.value.code) == (400, "prompt_too_long")
        assert h.providers["a"].bodies == []


@pytest.mark.parametrize(("body_in", "takes"), [(True, 2), (False, 3)])
async def test_a_whole_body_costs_one_decision_at_the_edge(body_in: bool, takes: int):
    """Tenant, route and rate gates plus the pool: a body still arriving is read
    holding only its tenant's slot (two edge decisions); a whole one needs one."""
    raw = config({"name": "a"}, route={"max_concurrency": 4})
    raw["tenants"][0]["limits"] = {"max_concurrency": 2, "requests_per_minute": 600}
    store = YieldingStore(MemoryLimitStore(FakeClock()))
    async with running(raw, {}, store) as h:
        await h.ask(h.inbound(max_tokens=10)._replace(body_in=lambda: body_in))
        assert store.takes == takes


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


OPENING = event({"role": "assistant", "content": ""})
END = event({}, "length") + b"data: [DONE]\n\n"
USAGE = b'data: {"id":"x","choices":[],"usage":{"total_tokens":9}}\n\n'
HANG = b""
"""In a script: nothing more comes until the stream is ended."""


def words(*texts: str) -> list[bytes]:
    return [event({"content": text}) for text in texts]


class ContinuedStream:
    """A stream that relays its `script` (`HANG` waits until it is ended)."""

    def __init__(self, provider: ContinuingProvider, script: list[bytes]) -> None:
        self._provider = provider
        self._script = script
        self.used_tokens: int | None = None
        self.completion_tokens: int | None = None

    async def read(self) -> bytes:
        raise AssertionError("a stream is never read whole")

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._script:
            if chunk is HANG:
                await asyncio.Event().wait()
            yield chunk
        self.used_tokens = 20

    def hand_over(self) -> None:
        self._provider.handed_over += 1


class ContinuingProvider(ScriptedProvider):
    """A `ScriptedProvider` whose first stream is `first` (by default an opening, two
    words, then nothing until it is ended) and every later one an opening, three words
    and the end, `later_s` after it was sent on `clock`."""

    def __init__(
        self, deployment: Any, first: list[bytes] | None = None, later_s: float = 0.0
    ) -> None:
        super().__init__(deployment)
        self.first = [OPENING, *words("w0 ", "w1 "), HANG] if first is None else first
        self.later_s = later_s
        self.handed_over = 0

    @asynccontextmanager
    async def open(
        self, endpoint: Endpoint, payload: dict[str, Any], budget_s: float
    ) -> AsyncIterator[ContinuedStream]:
        self.bodies.append(payload)
        if len(self.bodies) == 1:
            yield ContinuedStream(self, self.first)
            return
        if self.later_s:
            assert self.clock is not None
            await sleep_until(self.clock, self.clock.now() + self.later_s)
        yield ContinuedStream(self, [OPENING, *words("w2 ", "w3 ", "w4 "), END])


@asynccontextmanager
async def resumable(
    first: list[bytes] | None = None, names: tuple[str, ...] = ("a",), **route: Any
) -> AsyncIterator[Harness]:
    """A pipeline on `resumable` deployments answered by `ContinuingProvider`s (the first
    one's first stream is `first`), with the route's settings given."""
    clock = FakeClock()
    raw = config(*({"name": name, "resumable": True} for name in names), route=route)
    settings = parse_settings(raw, "test", ENV)
    providers = {}
    for deployment in settings.models["chat"].deployments:
        providers[deployment.name] = ContinuingProvider(
            deployment, first if not providers else None
        )
        providers[deployment.name].clock = clock
    runtime = build(settings, clock, providers)
    tasks = [asyncio.create_task(d.run()) for d in runtime.dispatchers.values()]
    try:
        yield Harness(runtime, clock, providers)
    finally:
        for task in tasks:
            task.cancel()


def contents(stream: bytes) -> list[str]:
    """The content of each event of `stream` that has any."""
    found = []
    for block in stream.split(b"\n\n"):
        choices = json.loads(block[6:])["choices"] if block.startswith(b"data: {") else []
        if choices and choices[0]["delta"].get("content"):
            found.append(choices[0]["delta"]["content"])
    return found


async def test_a_stream_that_gives_its_slot_away_goes_on_from_where_its_caller_stands():
    """Asked to give its slot away (as the dispatcher asks) after two words, the stream
    ends at that event's end, without the grace an abandoned call keeps, and goes on from
    a second attempt that continues the answer so far with what is left of its output
    cap. The caller gets one stream: one opening, the words of both parts, one finish,
    and every permit is back once it has ended, the pool's tokens settled on both parts:
    the first's prompt and its word, the second's reported usage."""
    async with resumable() as h:
        provider = h.providers["a"]
        got: list[bytes] = []
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            async for chunk in answer.chunks():
                got.append(chunk)
                if len(got) == 2:
                    answer.giver.ask()
        stream = b"".join(got)
        assert stream.count(b'"role"') == 1
        assert contents(stream) == ["w0 ", "w2 ", "w3 ", "w4 "]
        assert stream.endswith(b"data: [DONE]\n\n")
        first, rest = provider.bodies
        assert rest["messages"] == [*first["messages"], {"role": "assistant", "content": "w0 "}]
        assert (rest["continue_final_message"], rest["add_generation_prompt"]) == (True, False)
        assert rest["max_tokens"] == 9
        assert provider.handed_over == 1
        assert h.active("a") == 0
        counters = h.runtime.pools["a"].counters
        continued = answer.attempt.call.prompt_tokens
        assert (counters.tokens_used, counters.tokens_unsettled) == (continued + 20, 0)


async def test_a_stream_waiting_for_its_next_tokens_gives_its_slot_away_at_once():
    """The first stream has sent two words and the engine says nothing more: asked to
    give its slot away, the relay does not wait for a next event to end on (here it
    would never come) but stops the wait and continues after the two words."""
    async with resumable() as h:
        got: list[bytes] = []
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            chunks = answer.chunks()
            got += [await anext(chunks) for _ in range(3)]
            pending = asyncio.ensure_future(anext(chunks))
            await settle()
            assert not pending.done()
            answer.giver.ask()
            async with asyncio.timeout(5):
                got.append(await pending)
                got += [chunk async for chunk in chunks]
        assert contents(b"".join(got)) == ["w0 ", "w1 ", "w2 ", "w3 ", "w4 "]
        assert len(h.providers["a"].bodies) == 2


async def test_a_stream_asked_once_it_finishes_ends_as_it_is():
    """Asked to give its slot away as its usage event comes, after its finish (each a
    whole event apart), a stream is left to end: it is not continued."""
    first = [OPENING, *words("w0 ", "w1 "), event({}, "length"), USAGE, b"data: [DONE]\n\n"]
    async with resumable(first) as h:
        got: list[bytes] = []
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            async for chunk in answer.chunks():
                got.append(chunk)
                if b'"usage"' in chunk:
                    assert answer.giver.ask() is False
        assert contents(b"".join(got)) == ["w0 ", "w1 "]
        assert b"".join(got).endswith(b"data: [DONE]\n\n")
        assert len(h.providers["a"].bodies) == 1


async def test_a_stream_with_more_than_text_keeps_its_slot():
    """A stream that carried some thinking declines to give its slot away: its answer
    would not be continued as text."""
    async with resumable(
        [OPENING, event({"reasoning_content": "hm"}), *words("w0 ", "w1 "), HANG]
    ) as h:
        got: list[bytes] = []
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            chunks = answer.chunks()
            got += [await anext(chunks) for _ in range(4)]
            assert answer.giver.ask() is False
            assert not answer.giver.agreed
        assert len(h.providers["a"].bodies) == 1


async def test_a_caller_gone_as_its_stream_is_asked_for_its_slot_is_not_kept_waiting():
    """The relay's own interruption never swallows a cancellation of the caller's that
    comes with it: the request ends cancelled, and no second part is sent."""
    async with resumable() as h:
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            chunks = answer.chunks()
            for _ in range(3):
                await anext(chunks)
            pending = asyncio.ensure_future(anext(chunks))
            await settle()
            answer.giver.ask()
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        assert len(h.providers["a"].bodies) == 1


async def test_a_handed_over_request_is_timed_by_its_first_part():
    """Five seconds pass between the first part's first token and the second's: the
    request's time to first token and the overload monitor's window are the first
    part's, not a five-second first token."""
    async with resumable() as h:
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            chunks = answer.chunks()
            for _ in range(3):
                await anext(chunks)
            h.clock.advance(5.0)
            answer.giver.ask()
            rest = [chunk async for chunk in chunks]
        assert contents(b"".join(rest)) == ["w2 ", "w3 ", "w4 "]
        page = (await h.runtime.metrics.page()).decode()
        ttft_sum = next(
            line
            for line in page.splitlines()
            if line.startswith("sluicegate_time_to_first_token_seconds_sum")
        )
        assert float(ttft_sum.split()[-1]) < 1.0
        assert [seconds for _, seconds in h.runtime.pipeline.ttft._samples] == [0.0]


async def test_a_stream_that_turns_to_more_than_text_after_agreeing_keeps_its_slot():
    """Asked in the middle of an event, a plain stream agrees; the event it waited to end
    on carries thinking, so it withdraws and relays on to its end, not continued."""
    thinking = event({"reasoning_content": "hm"})
    first = [OPENING, *words("w0 "), thinking[:10], thinking[10:], *words("w1 "), END]
    async with resumable(first) as h:
        got: list[bytes] = []
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            async for chunk in answer.chunks():
                got.append(chunk)
                if chunk == thinking[:10]:
                    assert answer.giver.ask() is True
            assert not answer.giver.agreed
        assert b"".join(got) == b"".join(first)
        assert len(h.providers["a"].bodies) == 1


async def test_an_end_split_between_two_reads_is_still_an_end():
    """The finish event comes in two reads, split inside its marker, then the usage
    event: asked then, the stream declines; it has ended."""
    finish = event({}, "length")
    cut = finish.index(b"finish_reason") + 5
    first = [OPENING, *words("w0 "), finish[:cut], finish[cut:], USAGE, b"data: [DONE]\n\n"]
    async with resumable(first) as h:
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            async for chunk in answer.chunks():
                if chunk == USAGE:
                    assert answer.giver.ask() is False
        assert len(h.providers["a"].bodies) == 1


async def test_the_rest_of_an_answer_is_never_hedged():
    """On a hedged route of two deployments, the rest of an answer whose first bytes take
    a second (past the hedge's delay) is sent once."""
    async with resumable(names=("a", "b"), hedge_after_s=0.05) as h:
        for provider in h.providers.values():
            provider.later_s = 1.0
        async with h.runtime.pipeline.run(h.inbound(stream=True, max_tokens=10)) as answer:
            chunks = answer.chunks()
            for _ in range(3):
                await anext(chunks)
            answer.giver.ask()
            rest = asyncio.ensure_future(anext(chunks))
            await driven(h.clock, rest)
            got = [rest.result()] + [chunk async for chunk in chunks]
        assert contents(b"".join(got)) == ["w2 ", "w3 ", "w4 "]
        assert sum(len(provider.bodies) for provider in h.providers.values()) == 2


LANE_CAPPED = {"lanes": [{"name": "interactive", "max_output_tokens": 300}]}


@pytest.mark.parametrize(
    ("asked", "sent"),
    [({}, 300), ({"max_tokens": 50}, 50), ({"max_tokens": 900}, 300)],
)
async def test_a_lanes_output_cap_holds_a_request_that_names_no_limit(asked: dict, sent: int):
    """A request without `max_tokens` asks for as much as the model will write, which is
    more than the lane's cap (above the route's assumed 100 here), so it is capped too."""
    raw = config({"name": "a"}, scheduling=LANE_CAPPED)
    async with running(raw, {}) as h:
        await h.ask(h.inbound(**asked))
        (body,) = h.providers["a"].bodies
        assert body.get("max_completion_tokens", body.get("max_tokens")) == sent


async def test_a_request_without_a_limit_tells_an_anthropic_deployment_the_routes():
    """The Messages API requires `max_tokens`: the one sent is the route's
    `max_output_tokens` that admission reserved for, not a constant of the adapter."""
    raw = config({"name": "a", "provider": "anthropic"})
    async with running(raw, {}) as h:
        await h.ask(h.inbound())
        (body,) = h.providers["a"].bodies
        assert body["max_tokens"] == 100


async def test_a_request_without_a_limit_reaches_an_openai_deployment_without_one():
    raw = config({"name": "a"})
    async with running(raw, {}) as h:
        await h.ask(h.inbound())
        (body,) = h.providers["a"].bodies
        assert "max_tokens" not in body
        assert "max_completion_tokens" not in body
