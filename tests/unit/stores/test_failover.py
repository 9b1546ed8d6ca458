"""The degraded mode of a shared limit store, on a fake clock and a shared store that can
be taken down: each policy per kind of limit, no waiting on a store known to be down,
the probe, and convergence (local leases adopted) once it is back."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from sluicegate.core.clock import sleep_until
from sluicegate.core.limits import (
    Ask,
    Charge,
    GiveBack,
    Lease,
    Part,
    Prefill,
    PrefillEnd,
    PrefillState,
    Rate,
    Refund,
    Refused,
    Slot,
    StoreUnavailable,
)
from sluicegate.core.types import DegradedPolicy, WhenDown
from sluicegate.stores.failover import FailoverStore
from tests.support.clock import FakeClock
from tests.support.fakes import SharedFake

TTL_S = 30.0
PER_MINUTE_60 = Rate(limit=60, period_s=60, burst=60)
_ids = itertools.count(1)


def policy(
    concurrency: WhenDown = WhenDown.LOCAL_SHARE,
    rates: WhenDown = WhenDown.LOCAL_SHARE,
    expected: int = 1,
) -> DegradedPolicy:
    return DegradedPolicy(concurrency, rates, probe_s=0.5, expected_replicas=expected)


def make(
    clock: FakeClock, rule: DegradedPolicy | None = None, *, degraded: bool = False
) -> tuple[FailoverStore, SharedFake]:
    shared = SharedFake(clock)
    return FailoverStore(shared, clock, rule or policy(), TTL_S, degraded=degraded), shared


async def take(store: FailoverStore, ask: Ask) -> Lease | Refused:
    lease = Lease(f"r:{next(_ids)}", tuple(slot.key for slot in ask.slots))
    refused = await store.take(ask, lease, TTL_S)
    return lease if refused is None else refused


def slot(limit: int, key: str = "s") -> Ask:
    return Ask(slots=(Slot(key, limit),))


async def granted(store: FailoverStore, ask: Ask, tries: int = 20) -> int:
    return sum([isinstance(await take(store, ask), Lease) for _ in range(tries)])


class Load:
    """Requests arriving at `per_s` on the fake clock, spread over `replicas` round robin,
    each holding one slot of `s` for `hold_s`; what each replica answered."""

    def __init__(self, clock: FakeClock, replicas: list[FailoverStore], per_s: float) -> None:
        self.clock, self.replicas, self.per_s = clock, replicas, per_s
        self.hold_s = 0.1
        self.running: set[asyncio.Task[None]] = set()
        self.refused = 0

    async def arrive(self) -> None:
        for replica in itertools.cycle(self.replicas):
            await sleep_until(self.clock, self.clock.now() + 1 / self.per_s)
            request = asyncio.ensure_future(self.request(replica))
            self.running.add(request)
            request.add_done_callback(self.running.discard)

    async def request(self, replica: FailoverStore) -> None:
        held = await take(replica, slot(1_000))
        if not isinstance(held, Lease):
            self.refused += 1
            return
        await sleep_until(self.clock, self.clock.now() + self.hold_s)
        await replica.give_back([GiveBack(held)])


async def run_for(clock: FakeClock, seconds: float, until=lambda: False, step_s=0.001) -> float:
    """Move the clock by `step_s` at a time, letting every task run between steps, for
    `seconds` or until `until()` holds; the time it took."""
    began = clock.now()
    while clock.now() - began < seconds and not until():
        clock.advance(step_s)
        for _ in range(10):
            await asyncio.sleep(0)
    return clock.now() - began


async def test_while_the_shared_store_answers_every_decision_is_made_there():
    clock = FakeClock()
    store, shared = make(clock)
    assert await granted(store, slot(8)) == 8
    assert await shared.inner.in_use("s") == 8
    assert not store.degraded


async def test_local_share_admits_at_most_ceil_limit_over_live_replicas():
    clock = FakeClock()
    store, shared = make(clock)
    await shared.beat("other-1", TTL_S)
    await shared.beat("other-2", TTL_S)
    await store.run_once()
    assert store.live == 3
    shared.down = True
    assert await granted(store, slot(8)) == 3
    assert store.degraded
    rate = Ask(charges=(Charge("r", PER_MINUTE_60, 1),))
    assert await granted(store, rate, tries=60) == 20


async def test_the_call_that_finds_the_store_down_is_still_decided_and_later_ones_do_not_wait():
    clock = FakeClock()
    store, shared = make(clock)
    shared.down = True
    assert isinstance(await take(store, slot(2)), Lease)
    reached = shared.calls
    assert reached == 1
    assert await granted(store, slot(2)) == 1
    assert shared.calls == reached


async def test_fail_closed_refuses_only_its_own_kind_of_limit():
    clock = FakeClock()
    store, shared = make(clock, policy(concurrency=WhenDown.FAIL_CLOSED))
    shared.down = True
    with pytest.raises(StoreUnavailable):
        await take(store, slot(5))
    assert isinstance(await take(store, Ask(charges=(Charge("r", PER_MINUTE_60, 1),))), Lease)


async def test_fail_open_does_not_enforce_and_refusals_name_the_original_part():
    clock = FakeClock()
    store, shared = make(clock, policy(concurrency=WhenDown.FAIL_OPEN))
    shared.down = True
    assert await granted(store, slot(1)) == 20
    ask = Ask(
        slots=(Slot("s", 1), Slot("t", 1)),
        charges=(Charge("a", PER_MINUTE_60, 1), Charge("b", PER_MINUTE_60, 61)),
    )
    assert await take(store, ask) == Refused(Part.CHARGE, 1, float("inf"))


async def test_started_degraded_it_assumes_the_expected_replicas():
    clock = FakeClock()
    store, _ = make(clock, policy(expected=4), degraded=True)
    assert await granted(store, slot(8)) == 2


async def test_the_probe_brings_it_back_and_local_leases_are_adopted(caplog):
    clock = FakeClock()
    store, shared = make(clock)
    changes: list[bool] = []
    store.on_change(changes.append)
    shared.down = True
    held = await take(store, slot(4))
    assert isinstance(held, Lease)
    assert store.degraded
    runner = asyncio.ensure_future(store.run())
    await asyncio.sleep(0)
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert store.degraded
    shared.down = False
    with caplog.at_level(logging.WARNING, logger="sluicegate"):
        clock.advance(0.5)
        for _ in range(5):
            await asyncio.sleep(0)
    assert not store.degraded
    assert changes == [True, False]
    assert "reachable again" in caplog.text
    assert await shared.inner.in_use("s") == 1
    assert await granted(store, slot(4)) == 3
    await store.give_back([GiveBack(held)])
    assert await shared.inner.in_use("s") == 3
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


async def test_a_replica_degraded_between_heartbeats_probes_every_probe_s_from_then_on():
    """The heartbeat comes every third of the lease TTL while healthy; a replica that a
    request found the store gone from does not wait for it to try again."""
    clock = FakeClock()
    store, shared = make(clock)
    runner = asyncio.ensure_future(store.run())
    await run_for(clock, 1.0)
    shared.down = True
    assert isinstance(await take(store, slot(4)), Lease)
    assert store.degraded
    shared.down = False
    assert await run_for(clock, TTL_S, until=lambda: not store.degraded) <= 0.5 + 0.01
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


async def test_a_cooldown_set_while_healthy_still_holds_when_the_store_goes_away():
    clock = FakeClock()
    store, shared = make(clock)
    await store.cool("c", 10)
    shared.down = True
    refused = await take(store, Ask(cooldowns=("c",), slots=(Slot("s", 1),)))
    assert refused == Refused(Part.COOLDOWN, 0, pytest.approx(10))


async def test_one_late_answer_refuses_that_call_only_and_three_in_a_row_degrade():
    clock = FakeClock()
    store, shared = make(clock)
    shared.slow = True
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            await take(store, slot(4))
        assert not store.degraded
    assert isinstance(await take(store, slot(4)), Lease)
    assert store.degraded
    assert store.view().timeouts == 3


async def test_an_answer_in_time_resets_the_count_of_late_ones():
    clock = FakeClock()
    store, shared = make(clock)
    for _ in range(3):
        shared.slow = True
        with pytest.raises(StoreUnavailable):
            await take(store, slot(20))
        shared.slow = False
        assert isinstance(await take(store, slot(20)), Lease)
    assert not store.degraded


async def test_what_the_shared_store_granted_counts_against_the_local_share():
    """Two leases in flight when the store went away: a share of 2 admits nothing more."""
    clock = FakeClock()
    store, shared = make(clock, policy(expected=2))
    held = [await take(store, slot(4)) for _ in range(2)]
    shared.down = True
    assert await granted(store, slot(4)) == 0
    await store.give_back([GiveBack(held[0])])
    assert await granted(store, slot(4)) == 1


async def test_leases_that_ended_while_degraded_are_released_in_the_shared_store_on_return():
    clock = FakeClock()
    store, shared = make(clock)
    first, second = await take(store, slot(4)), await take(store, slot(4))
    shared.down = True
    await store.give_back([GiveBack(first)])
    assert store.degraded
    shared.down = False
    await store.run_once()
    assert not store.degraded
    assert await shared.inner.in_use("s") == 1
    await store.give_back([GiveBack(second)])
    assert await shared.inner.in_use("s") == 0


async def test_a_take_answered_too_late_is_released_at_the_next_heartbeat():
    """The store may have granted it: nobody holds it here, so it must not stay there."""
    clock = FakeClock()
    store, shared = make(clock)
    shared.slow = True
    with pytest.raises(StoreUnavailable):
        await take(store, slot(4))
    assert await shared.inner.in_use("s") == 1
    shared.slow = False
    await store.run_once()
    assert await shared.inner.in_use("s") == 0
    assert not store.degraded


async def test_a_lease_the_shared_store_grants_after_the_switch_is_counted_locally():
    clock = FakeClock()
    store, shared = make(clock)
    shared.hold = asyncio.Event()
    late = asyncio.ensure_future(take(store, slot(2)))
    await asyncio.sleep(0)
    shared.down = True
    assert isinstance(await take(store, slot(2)), Lease)
    assert store.degraded
    shared.down = False
    shared.hold.set()
    assert isinstance(await late, Lease)
    assert await granted(store, slot(2)) == 0


async def test_a_recovery_that_fails_half_way_keeps_every_lease_counted_here():
    clock = FakeClock()
    store, shared = make(clock)
    shared.down = True
    held = [await take(store, slot(2)) for _ in range(2)]
    shared.down, shared.adopting_fails = False, True
    await store.run_once()
    assert store.degraded
    assert await granted(store, slot(2)) == 0
    shared.adopting_fails = False
    await store.run_once()
    assert not store.degraded
    assert await shared.inner.in_use("s") == 2
    for lease in held:
        await store.give_back([GiveBack(lease)])
    assert await shared.inner.in_use("s") == 0


async def test_a_give_back_while_degraded_refunds_the_local_share_and_releases_there_on_return():
    """Rates as local shares of 60 / 2: the refund is applied to this replica's share,
    and the release is done again in the shared store once it answers."""
    clock = FakeClock()
    store, shared = make(clock, policy(expected=2))
    spent = Charge("r", PER_MINUTE_60, 20)
    shared.down = True
    lease = await take(store, Ask(slots=(Slot("s", 4),), charges=(spent,)))
    assert isinstance(lease, Lease)
    await store.give_back([GiveBack(lease, (Refund(spent, 15),))])
    assert await store.available("r", PER_MINUTE_60) == pytest.approx(25)
    shared.down = False
    await store.run_once()
    assert not store.degraded
    assert await shared.inner.in_use("s") == 0
    assert await shared.inner.available("r", PER_MINUTE_60) == pytest.approx(60)


async def test_a_give_back_that_finds_the_store_down_is_done_locally_and_again_on_return():
    """Granted by the shared store, whose give-back call finds it gone: the lease is
    released there once it answers, without its refund (which this replica applied to
    its own share when the call failed)."""
    clock = FakeClock()
    store, shared = make(clock)
    spent = Charge("r", PER_MINUTE_60, 20)
    lease = await take(store, Ask(slots=(Slot("s", 4),), charges=(spent,)))
    assert isinstance(lease, Lease)
    shared.down = True
    await store.give_back([GiveBack(lease, (Refund(spent, 15),))])
    assert store.degraded
    assert await shared.inner.in_use("s") == 1
    shared.down = False
    await store.run_once()
    assert await shared.inner.in_use("s") == 0
    assert await shared.inner.available("r", PER_MINUTE_60) == pytest.approx(40)


def prompt(tokens: int) -> Ask:
    """A streamed prompt counted in prefill budget `b`."""
    return Ask(slots=(Slot("s", 10),), prefill=Prefill("b", tokens, 1.0))


async def test_a_prompt_s_prefill_ends_where_its_decision_was_made():
    """Decided while the shared store answered, a prompt ends there; decided here while
    it was away, here; one the shared store counts, ended while it is away, does not
    wait for it (it is told on its return: the next test)."""
    clock = FakeClock()
    store, shared = make(clock)

    there = await take(store, prompt(2_000))
    assert isinstance(there, Lease)
    clock.advance(0.1)
    assert await store.prefilled([PrefillEnd("b", there.id, True)]) == {
        "b": PrefillState(0, pytest.approx(20_000))
    }
    counted = await take(store, prompt(1_000))
    assert isinstance(counted, Lease)
    shared.down = True
    here = await take(store, prompt(3_000))
    assert isinstance(here, Lease)
    assert store.degraded
    reached = shared.calls
    clock.advance(0.1)
    ended = await store.prefilled(
        [PrefillEnd("b", counted.id, True), PrefillEnd("b", here.id, True)]
    )
    assert ended == {"b": PrefillState(0, pytest.approx(30_000))}
    assert shared.calls == reached


async def test_prompts_ended_in_an_outage_are_told_on_return_and_local_ones_end_here():
    """A prompt the shared store counts, ended while it is away, is told once it answers
    (else renewing its lease would keep it counted there); a prompt counted here while
    degraded ends here, though its lease is handed to the shared store on return."""
    clock = FakeClock()
    store, shared = make(clock)

    there = await take(store, prompt(2_000))
    assert isinstance(there, Lease)
    shared.down = True
    here = await take(store, prompt(3_000))
    assert isinstance(here, Lease)
    assert store.degraded
    await store.prefilled([PrefillEnd("b", there.id, False)])
    shared.down = False
    await store.run_once()
    assert not store.degraded
    assert isinstance(await take(store, prompt(1)), Lease), "the shared budget was told"
    await store.prefilled([PrefillEnd("b", here.id, False)])
    shared.down = True
    assert isinstance(await take(store, prompt(1)), Lease), "the local budget ended it"


async def test_two_busy_replicas_are_shared_again_within_5s_of_the_store_answering():
    """200 requests per second over two replicas, each holding its lease 0.1 s, a round
    trip of 5 ms: something is taken or freed during every call of a recovery, and both
    replicas still hand their leases over and decide in the shared store again, at their
    first probe that finds it answering. What they held is counted there exactly: once
    every request ended, nothing is."""
    clock = FakeClock()
    shared = SharedFake(clock)
    shared.latency_s = 0.005
    replicas = [FailoverStore(shared, clock, policy(), TTL_S) for _ in range(2)]
    load = Load(clock, replicas, per_s=200)
    tasks = [asyncio.ensure_future(r.run()) for r in replicas]
    tasks.append(asyncio.ensure_future(load.arrive()))
    await run_for(clock, 1.0)
    shared.down = True
    await run_for(clock, 2.0)
    assert all(r.degraded for r in replicas)
    shared.down = False
    took = await run_for(clock, 10.0, until=lambda: not any(r.degraded for r in replicas))
    assert took <= 5.0
    await run_for(clock, 1.0)
    assert not any(r.degraded for r in replicas)
    tasks.pop().cancel()
    await run_for(clock, 1.0, until=lambda: not load.running)
    assert not load.running
    assert load.refused == 0
    assert await shared.inner.in_use("s") == 0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_decision_during_the_hand_over_waits_for_it_and_is_made_in_the_shared_store():
    """A lease taken here while the bulk is adopted is adopted in the hand-over's last
    call; a decision asked during that call waits for it (one bounded call), then is made
    in the shared store: no lease granted here is left uncounted there."""
    clock = FakeClock()
    store, shared = make(clock)
    shared.down = True
    assert isinstance(await take(store, slot(10)), Lease)
    shared.down, shared.latency_s = False, 0.01
    probe = asyncio.ensure_future(store.run_once())
    calls = shared.calls
    await run_for(clock, 1.0, until=lambda: shared.calls == calls + 3)
    # the beat, the release of the take that found the store down, the bulk adoption
    assert isinstance(await take(store, slot(10)), Lease)
    await run_for(clock, 1.0, until=lambda: shared.calls == calls + 4)
    assert store.degraded
    third = asyncio.ensure_future(take(store, slot(10)))
    await run_for(clock, 0.002)
    assert not third.done()
    await run_for(clock, 0.1, until=third.done)
    assert isinstance(third.result(), Lease)
    assert not store.degraded
    assert await shared.inner.in_use("s") == 3
    await probe
