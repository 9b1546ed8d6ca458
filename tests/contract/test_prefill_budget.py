"""The prefill budget (`core.prefill`) as every `LimitStore` keeps it, on the test's
clock: what it admits before and after a measure, and what it learns from first
tokens. The Redis store's scripts must reach the same numbers as the in-memory store's
arithmetic."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from sluicegate.core.limits import (
    Ask,
    Charge,
    Lease,
    LimitStore,
    Part,
    Prefill,
    PrefillEnd,
    PrefillState,
    Rate,
    Refused,
    Slot,
)
from sluicegate.stores.redis import RedisLimitStore
from sluicegate.stores.resp import RespConnection
from tests.contract.test_limit_store import STORES
from tests.support.clock import FakeClock
from tests.support.redis import REDIS_URL, redis_or_skip

BUDGET = "{pools}prefill:d"
TTL_S = 30.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def shared(clock) -> AsyncIterator[LimitStore]:
    async with redis_or_skip() as (_, prefix):
        yield RedisLimitStore(RespConnection(REDIS_URL, 5.0), prefix, 5.0, clock=clock)


@pytest.fixture(params=[*sorted(STORES), "redis"])
def store(request, clock) -> LimitStore:
    if request.param == "redis":
        return request.getfixturevalue("shared")
    return STORES[request.param](clock)


_ids = itertools.count(1)


class Budget:
    """One deployment's budget, asked as the pools ask it: with a slot, under a lease."""

    def __init__(self, store: LimitStore) -> None:
        self.store = store
        self.look_again_s: float | None = None
        """When the last refusal may lift with time alone (a due time passing)."""

    async def send(self, tokens: int, within_s: float = 1.0, due: bool = False) -> str | None:
        """The lease id counting the prompt, or None when the budget refused it."""
        lease = Lease(f"test:{next(_ids)}", ("slots",))
        prefill = Prefill(BUDGET, tokens, within_s, due)
        refused = await self.store.take(
            Ask(slots=(Slot("slots", 1_000),), prefill=prefill), lease, TTL_S
        )
        if refused is None:
            return lease.id
        assert (refused.part, refused.index) == (Part.PREFILL, 0)
        self.look_again_s = refused.retry_after_s
        return None

    async def sent(self, *tokens: int) -> list[str]:
        ids = [await self.send(each) for each in tokens]
        assert None not in ids
        return [each for each in ids if each is not None]

    async def first_tokens(self, *ids: str) -> PrefillState:
        states = await self.store.prefilled([PrefillEnd(BUDGET, each, True) for each in ids])
        return states[BUDGET]

    async def dropped(self, lease_id: str) -> PrefillState:
        return (await self.store.prefilled([PrefillEnd(BUDGET, lease_id, False)]))[BUDGET]


async def test_before_any_measure_one_prompt_goes_at_a_time_however_short(store):
    budget = Budget(store)
    assert await budget.send(100_000)
    assert await budget.send(1) is None


async def test_prompts_prefilled_together_are_measured_together(store, clock):
    """Prompts sent together reach their first tokens in one engine step: four of 3,000
    prefilled in 0.6 s are one measure of 12,000 tokens in 0.6 s, not four of 3,000 in
    0.6 s each (5,000 tokens/s)."""
    budget = Budget(store)
    first = await budget.sent(3_000)
    clock.advance(0.15)
    await budget.first_tokens(*first)
    clock.advance(1.0)
    ids = await budget.sent(*[3_000] * 2)
    clock.advance(0.3)
    await budget.first_tokens(*ids)
    clock.advance(1.0)
    ids = await budget.sent(*[3_000] * 4)
    clock.advance(0.6)
    state = await budget.first_tokens(*ids)
    assert state.tokens_per_s == pytest.approx(20_000, rel=0.1)
    assert state.pending == 0


async def test_the_limit_follows_the_promise_part_and_grows_to_twice_what_was_seen(store, clock):
    """One 3,000-token prompt prefilled in 0.15 s: 20,000 tokens/s, but only 3,000 seen
    prefilled together, so 6,000 may wait together next, not the 20,000 the rate would
    allow; once those reached their first tokens together, 12,000; and with a budget
    part of 0.5 s, 10,000."""
    budget = Budget(store)
    first = await budget.sent(3_000)
    clock.advance(0.15)
    state = await budget.first_tokens(*first)
    assert state.tokens_per_s == pytest.approx(20_000)
    ids = await budget.sent(3_000, 3_000)
    assert await budget.send(1) is None
    clock.advance(0.3)
    await budget.first_tokens(*ids)
    held = await budget.sent(*[3_000] * 4)
    assert await budget.send(1) is None
    for lease_id in held:
        await budget.dropped(lease_id)
    held = await budget.sent(5_000)
    assert await budget.send(5_001, within_s=0.5) is None, "10,000 tokens take 0.5 s"
    assert await budget.send(4_000, within_s=0.5)
    assert await budget.send(1, within_s=-0.5) is None


async def due_after_a_measure(budget: Budget, clock: FakeClock) -> str:
    """Learn 20,000 tokens/s with 3,000 tokens seen together, then send a 4,000-token
    prompt on the 0.25 s its promise has left: due then. Its lease id."""
    first = await budget.sent(3_000)
    clock.advance(0.15)
    await budget.first_tokens(*first)
    late = await budget.send(4_000, within_s=0.25, due=True)
    assert late
    return late


async def test_a_newcomer_may_not_take_the_time_a_waiting_prompt_has_left(store, clock):
    """At 20,000 tokens/s, a 4,000-token prompt sent on the 0.25 s its promise has left
    is due by then: a fresh prompt, though its own promise leaves it a second, may join
    it only while the two take no longer than 0.25 s (5,000 tokens), and less as that
    time runs; a refusal says when the due time passes. Past it, the prompt holds nobody
    (it is late whatever follows, and one that never gets its first token must not hold
    the others). A prompt sent on the budget's own part is due nowhere."""
    budget = Budget(store)
    late = await due_after_a_measure(budget, clock)
    assert await budget.send(1_010) is None
    assert budget.look_again_s == pytest.approx(0.25)
    fresh = await budget.send(990)
    assert fresh
    await budget.dropped(fresh)
    clock.advance(0.1)
    assert await budget.send(990) is None, "0.15 s left: 3,000 tokens"
    assert budget.look_again_s == pytest.approx(0.15)
    clock.advance(0.2)
    joined = await budget.send(1_000)
    assert joined
    assert await budget.send(1_010) is None, "twice the 3,000 seen together"
    assert budget.look_again_s is None
    await budget.first_tokens(late, joined)
    assert await budget.send(4_000, within_s=0.25)
    assert await budget.send(1_010), "not due: limited by the rate and the growth only"


async def test_a_due_prompt_that_ends_holds_nobody(store, clock):
    """Its due time goes with it: with it gone, 5,490 tokens may wait together (twice
    the 3,000 seen), where its due time would have allowed 5,000."""
    budget = Budget(store)
    late = await due_after_a_measure(budget, clock)
    assert await budget.send(990)
    await budget.dropped(late)
    assert await budget.send(4_500)


async def test_first_tokens_of_one_step_that_arrive_apart_are_still_one_measure(store, clock):
    """Ten prompts prefilled in one 1 s step, their first tokens handled 0.1 ms apart
    (each stream's relay in its own turn of the event loop): 20,000 tokens/s, not the
    33,600 a fade at each first token made of it."""
    budget = Budget(store)
    first = await budget.sent(2_000)
    clock.advance(0.1)
    await budget.first_tokens(*first)
    clock.advance(1.0)
    ids = await budget.sent(2_000, 2_000)
    clock.advance(0.2)
    await budget.first_tokens(*ids)
    ids = await budget.sent(*[2_000] * 4)
    clock.advance(0.4)
    await budget.first_tokens(*ids)
    ids = await budget.sent(*[2_000] * 8)
    clock.advance(0.8)
    for lease_id in ids:
        clock.advance(0.000_1)
        state = await budget.first_tokens(lease_id)
    assert state.tokens_per_s == pytest.approx(20_000, rel=0.01)


async def test_idle_time_between_busy_periods_is_not_counted(store, clock):
    budget = Budget(store)
    first = await budget.sent(2_000)
    clock.advance(0.1)
    await budget.first_tokens(*first)
    clock.advance(50.0)
    second = await budget.sent(2_000)
    clock.advance(0.1)
    state = await budget.first_tokens(*second)
    assert state.tokens_per_s == pytest.approx(20_000)


async def test_a_prompt_that_ends_without_a_first_token_frees_its_tokens_and_teaches_nothing(
    store, clock
):
    budget = Budget(store)
    (lease_id,) = await budget.sent(3_000)
    state = await budget.dropped(lease_id)
    assert state == PrefillState(0, None)
    assert await budget.send(3_000)
    assert await budget.first_tokens(lease_id) == PrefillState(3_000, None), "ended already"


async def test_a_slower_backend_lowers_the_limit(store, clock):
    budget = Budget(store)
    first = await budget.sent(4_000)
    clock.advance(0.2)
    fast = await budget.first_tokens(*first)
    for _ in range(40):
        clock.advance(10.0)
        ids = await budget.sent(4_000)
        clock.advance(0.6)
        slow = await budget.first_tokens(*ids)
    assert fast.tokens_per_s == pytest.approx(20_000)
    assert slow.tokens_per_s == pytest.approx(4_000 / 0.6, rel=0.05)


async def test_a_prompt_whose_sender_never_reports_lapses_with_the_lease_ttl(shared, clock):
    """A replica that died mid-prefill does not hold the budget for ever: on the shared
    store its prompt stops counting once the lease's TTL has passed unrenewed. (One
    process always reports its own prompts' ends, so the in-memory store needs no
    lapse.) Its due time goes with it, even one still to come (a promise longer than the
    lease's TTL): it does not hold the prompts sent after it."""
    budget = Budget(shared)
    first = await budget.sent(3_000)
    clock.advance(0.15)
    await budget.first_tokens(*first)
    assert await budget.send(3_000, within_s=TTL_S + 0.3, due=True)
    clock.advance(TTL_S + 0.1)
    assert await budget.send(3_000)
    assert await budget.send(1_500), "with the lapsed one's due time, 4,000 tokens"


async def test_a_prompt_is_renewed_with_its_lease_and_lapses_once_that_is_not_held(shared, clock):
    """A prefill may outlast the lease TTL (a slow backend, a short TTL): renewed with its
    lease, the prompt stays counted; once its lease is no longer held here (given back
    without its end reaching the store), it lapses within one TTL."""
    budget = Budget(shared)
    lease = Lease("test:renewed", ("slots",))
    ask = Ask(slots=(Slot("slots", 1_000),), prefill=Prefill(BUDGET, 3_000, 1.0))
    assert await shared.take(ask, lease, TTL_S) is None
    for _ in range(3):
        clock.advance(TTL_S * 0.6)
        await shared.renew([lease], TTL_S)
    assert await budget.send(1) is None, "still counted after 1.8 TTLs"
    await shared.renew([], TTL_S)
    clock.advance(TTL_S + 0.1)
    assert await budget.send(1)


async def test_a_rate_refuses_before_the_budget_and_says_when(store, clock):
    """The same part refuses on every store, so a degraded replica times its wake-up as
    the shared store would have."""
    budget = Budget(store)
    assert await budget.send(3_000)
    rate = Rate(limit=1, period_s=60, burst=1)
    ask = Ask(
        slots=(Slot("slots", 1_000),),
        charges=(Charge("r", rate, 1),),
        prefill=Prefill(BUDGET, 1, 1.0),
    )
    assert await store.take(ask._replace(prefill=None), Lease("a", ("slots",)), TTL_S) is None
    refused = await store.take(ask, Lease("b", ("slots",)), TTL_S)
    assert refused == Refused(Part.CHARGE, 0, pytest.approx(60.0))
