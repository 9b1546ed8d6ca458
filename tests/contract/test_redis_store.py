"""What the Redis store promises beyond the shared contract: the server's clock, a TTL on
every key, keys under the prefix and the layout version, replicas sharing one state,
adopted leases, live-replica counts, and a bounded wait on a Redis that is gone or mute."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator

import pytest

from sluicegate.core import keys
from sluicegate.core.leases import Leases
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
from sluicegate.stores.redis import (
    CLAIM_S,
    LAYOUT,
    LEARNT_KEPT_S,
    LEASES_AT_ONCE,
    RedisLimitStore,
    listener,
)
from sluicegate.stores.resp import RespConnection
from tests.support.clock import FakeClock
from tests.support.processes import free_port
from tests.support.redis import REDIS_URL, RedisServer, redis_or_skip

TTL_S = 30.0
RATE = Rate(limit=60, period_s=60, burst=2)


@pytest.fixture
async def redis() -> AsyncIterator[tuple[object, str]]:
    async with redis_or_skip() as found:
        yield found


def shared(prefix: str, clock: FakeClock | None = None) -> RedisLimitStore:
    return RedisLimitStore(RespConnection(REDIS_URL, 5.0), prefix, 5.0, clock=clock)


def lease(name: str, *keys: str) -> Lease:
    return Lease(f"test:{name}", keys)


async def test_without_a_test_clock_the_server_clock_decides(redis):
    _, prefix = redis
    store = shared(prefix)
    ask = Ask(charges=(Charge("r", RATE, 1),))
    assert await store.take(ask, lease("a"), TTL_S) is None
    assert await store.take(ask, lease("b"), TTL_S) is None
    refused = await store.take(ask, lease("c"), TTL_S)
    assert refused == Refused(Part.CHARGE, 0, pytest.approx(1.0, abs=0.2))


async def test_every_key_has_a_ttl_and_lives_under_the_prefix_and_layout(redis):
    client, prefix = redis
    store = shared(prefix)
    held, ended = lease("a", "{t}s"), lease("b", "{t}s")
    ask = Ask(slots=(Slot("{t}s", 3),), charges=(Charge("{t}r", RATE, 1),))
    for taken in (held, ended):
        assert await store.take(ask, taken, TTL_S) is None
    await store.renew([held], TTL_S)
    await store.cool("{t}c", 5)
    await store.give_back([GiveBack(ended, (Refund(Charge("{t}r", RATE, 1), -1),))])
    await store.beat("replica-1", TTL_S)
    keys = sorted([key.decode() async for key in client.scan_iter(match=f"{prefix}*")])
    assert keys == [
        f"{prefix}{LAYOUT}:{name}" for name in ("{fleet}replicas", "{t}c", "{t}r", "{t}s")
    ]
    for key in keys:
        assert 0 < await client.pttl(key) <= (TTL_S + 2) * 1000


async def test_a_refusal_creates_no_key(redis):
    client, prefix = redis
    store = shared(prefix)
    ask = Ask(slots=(Slot("s", 1),), charges=(Charge("r", RATE, 3),))
    refused = await store.take(ask, lease("a", "s"), TTL_S)
    assert refused == Refused(Part.CHARGE, 0, float("inf"))
    assert [key async for key in client.scan_iter(match=f"{prefix}*")] == []


async def test_two_replicas_on_one_redis_share_a_slot(redis):
    _, prefix = redis
    one = shared(prefix)
    two = shared(prefix)
    ask = Ask(slots=(Slot("s", 1),))
    first = lease("one", "s")
    assert await one.take(ask, first, TTL_S) is None
    assert await two.take(ask, lease("two", "s"), TTL_S) == Refused(Part.SLOT, 0, None)
    await one.give_back([GiveBack(first)])
    assert await two.take(ask, lease("two", "s"), TTL_S) is None


async def test_adopting_brings_back_a_lapsed_lease_and_renewing_does_not(redis):
    _, prefix = redis
    clock = FakeClock()
    store = shared(prefix, clock)
    renewed, adopted = lease("renewed", "s"), lease("adopted", "s")
    for held in (renewed, adopted):
        assert await store.take(Ask(slots=(Slot("s", 5),)), held, TTL_S) is None
    clock.advance(TTL_S + 1)
    await store.renew([renewed], TTL_S)
    await store.adopt([adopted, lease("never-seen", "s")], TTL_S)
    assert await store.in_use("s") == 2


async def test_replicas_that_stop_beating_drop_out_of_the_live_count(redis):
    _, prefix = redis
    clock = FakeClock()
    store = shared(prefix, clock)
    assert await store.beat("a", 3.0) == 1
    assert await store.beat("b", 3.0) == 2
    clock.advance(2.0)
    assert await store.beat("a", 3.0) == 2
    clock.advance(2.0)
    assert await store.beat("a", 3.0) == 1


async def test_a_redis_that_refuses_connections_is_unavailable_at_once():
    connection = RespConnection(f"redis://127.0.0.1:{free_port()}/0", 0.05)
    store = RedisLimitStore(connection, "x:", timeout_s=0.05)
    with pytest.raises(StoreUnavailable):
        await store.in_use("s")
    with pytest.raises(StoreUnavailable):
        await store.give_back([GiveBack(lease("a", "s"), (Refund(Charge("r", RATE, 1), 1),))])
    await store.close()


class Counting(RespConnection):
    """The store's own connection, recording how many scripts each call sent together."""

    def __init__(self, url: str, connect_timeout_s: float) -> None:
        super().__init__(url, connect_timeout_s)
        self.sent: list[int] = []

    async def calls(self, commands, at_once=True):
        self.sent.append(sum(command[0] == "EVALSHA" for command in commands))
        return await super().calls(commands, at_once)


async def test_a_give_back_is_one_script_per_hash_tag_whatever_it_carries(redis):
    """The edge's two leases with their refunds, and a pool's: two scripts, one per shard
    of a future cluster, sent together."""
    _, prefix = redis
    connection = Counting(REDIS_URL, 5.0)
    store = RedisLimitStore(connection, prefix, 5.0)
    tokens = Charge("{e}tokens", RATE, 2)
    tenant, route, pool = lease("t", "{e}tenant"), lease("r", "{e}route"), lease("p", "{p}pool")
    for held, charges in ((tenant, ()), (route, (tokens,)), (pool, ())):
        assert (
            await store.take(Ask(slots=(Slot(held.keys[0], 1),), charges=charges), held, TTL_S)
            is None
        )
    connection.sent.clear()
    await store.give_back([GiveBack(tenant), GiveBack(route, (Refund(tokens, 1),)), GiveBack(pool)])
    assert connection.sent == [2]
    assert [await store.in_use(k) for k in ("{e}tenant", "{e}route", "{p}pool")] == [0, 0, 0]
    assert await store.available("{e}tokens", RATE) == pytest.approx(1, abs=0.1)
    await store.close()


async def test_renewing_and_adopting_many_leases_is_split_into_scripts_sent_together(redis):
    """A script holds the server for its whole run: however many leases a replica holds
    (or hands over on its return), no one renewal or adoption holds it for all of them."""
    _, prefix = redis
    clock = FakeClock()
    connection = Counting(REDIS_URL, 5.0)
    store = RedisLimitStore(connection, prefix, 5.0, clock=clock)
    held = [lease(f"l{i}", "{p}slots") for i in range(3 * LEASES_AT_ONCE)]
    held += [lease(f"e{i}", "{e}slots") for i in range(LEASES_AT_ONCE // 2)]
    await store.adopt(held, TTL_S)
    assert connection.sent == [4]
    clock.advance(TTL_S / 2)
    await store.renew(held, TTL_S)
    assert connection.sent == [4, 4]
    clock.advance(TTL_S / 2 + 1)
    assert [await store.in_use(k) for k in ("{p}slots", "{e}slots")] == [
        3 * LEASES_AT_ONCE,
        LEASES_AT_ONCE // 2,
    ]
    await store.close()


async def test_a_detached_give_back_reaches_redis_before_any_later_decision(redis):
    """Its scripts (one per hash tag) are queued in the give-back task's first turn: a
    decision this process starts after that turn finds the slots free."""
    _, prefix = redis
    store = shared(prefix)
    leases = Leases(store, FakeClock(), detached=True)
    edge, pool = Ask(slots=(Slot("{e}route", 1),)), Ask(slots=(Slot("{p}pool", 1),))
    held = [await leases.take(ask) for ask in (edge, pool)]
    for taken in held:
        assert isinstance(taken, Lease)
        await leases.give_back(taken)
    await asyncio.sleep(0)
    assert isinstance(await leases.take(pool), Lease)
    assert isinstance(await leases.take(edge), Lease)
    await store.close()


async def test_a_redis_that_never_answers_is_unavailable_within_the_timeout():
    """A peer that accepts and then says nothing (a hung server, a black-holed link)."""
    held: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisLimitStore(RespConnection(f"redis://127.0.0.1:{port}/0", 0.05), "x:", 0.05)
    began = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await store.take(Ask(slots=(Slot("s", 1),)), lease("a", "s"), TTL_S)
    assert time.monotonic() - began < 1.0
    await store.close()
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_a_freed_slot_is_announced_to_every_listener_once(redis):
    """Only the slots announced: nobody queues for the others."""
    _, prefix = redis
    store = shared(prefix)
    store.announce(["{p}s", "{p}t"])
    subscriber = listener(REDIS_URL, 5.0)
    heard: list[str] = []
    watching = asyncio.ensure_future(store.watch_releases(subscriber, heard.append, 0.1))
    held = lease("a", "{p}u", "{p}s", "{p}t")
    slots = (Slot("{p}u", 1), Slot("{p}s", 1), Slot("{p}t", 1))
    assert await store.take(Ask(slots=slots), held, TTL_S) is None
    await asyncio.sleep(0.2)
    await store.give_back([GiveBack(held)])
    await store.give_back([GiveBack(held)])
    for _ in range(50):
        if len(heard) == 2:
            break
        await asyncio.sleep(0.02)
    assert heard == ["{p}s", "{p}t"]
    watching.cancel()
    await asyncio.gather(watching, return_exceptions=True)
    await subscriber.aclose()


def replica_lease(replica: str, number: int, key: str) -> Lease:
    """A lease as `Leases` names them: its replica, then a counter."""
    return Lease(f"{replica}:{number}", (key,))


async def test_a_slot_freed_while_a_replica_waits_goes_to_it_whoever_freed_it(redis):
    """Without the line the replica freeing a slot takes it again first (its next request
    is already there) and another replica's waiters starve."""
    _, prefix = redis
    clock = FakeClock()
    store = shared(prefix, clock)
    store.announce(["{p}s"])
    ask = Ask(slots=(Slot("{p}s", 2),), queued=True)
    first, second = replica_lease("one", 1, "{p}s"), replica_lease("one", 2, "{p}s")
    assert await store.take(ask, first, TTL_S) is None
    assert await store.take(ask, second, TTL_S) is None
    assert await store.take(ask, replica_lease("two", 1, "{p}s"), TTL_S) == Refused(
        Part.SLOT, 0, None
    )
    await store.give_back([GiveBack(first)])
    refused = await store.take(ask, replica_lease("one", 3, "{p}s"), TTL_S)
    assert refused == Refused(Part.SLOT, 0, pytest.approx(CLAIM_S))
    waiter = replica_lease("two", 2, "{p}s")
    assert await store.take(ask, waiter, TTL_S) is None
    await store.give_back([GiveBack(waiter)])
    assert await store.take(ask, replica_lease("two", 3, "{p}s"), TTL_S) is not None
    assert await store.take(ask, replica_lease("one", 4, "{p}s"), TTL_S) is None


async def one_holds_two_waits(prefix: str, clock: FakeClock) -> tuple[RedisLimitStore, Ask, Lease]:
    """A lined slot of 1 held by replica `one`, replica `two` refused from its queue."""
    store = shared(prefix, clock)
    store.announce(["{p}s"])
    ask = Ask(slots=(Slot("{p}s", 1),), queued=True)
    held = replica_lease("one", 1, "{p}s")
    assert await store.take(ask, held, TTL_S) is None
    assert await store.take(ask, replica_lease("two", 1, "{p}s"), TTL_S) is not None
    return store, ask, held


async def test_a_slot_set_aside_for_a_replica_that_never_comes_is_free_again_soon(redis):
    clock = FakeClock()
    store, ask, held = await one_holds_two_waits(redis[1], clock)
    await store.give_back([GiveBack(held)])
    clock.advance(CLAIM_S / 2)
    refused = await store.take(ask, replica_lease("one", 2, "{p}s"), TTL_S)
    assert refused == Refused(Part.SLOT, 0, pytest.approx(CLAIM_S / 2))
    clock.advance(CLAIM_S / 2)
    assert await store.take(ask, replica_lease("three", 1, "{p}s"), TTL_S) is None


async def test_a_slot_freed_with_nobody_in_line_is_nobody_s_and_lines_keep_no_key(redis):
    """The line forms only when a replica is refused: uncontended slots pay nothing, and
    a line and its set-asides, once empty, leave no key behind."""
    client, prefix = redis
    clock = FakeClock()
    store = shared(prefix, clock)
    store.announce(["{p}s"])
    ask = Ask(slots=(Slot("{p}s", 1),), queued=True)
    held = replica_lease("one", 1, "{p}s")
    assert await store.take(ask, held, TTL_S) is None
    await store.give_back([GiveBack(held)])
    again = replica_lease("one", 2, "{p}s")
    assert await store.take(ask, again, TTL_S) is None
    assert await store.take(ask, replica_lease("two", 1, "{p}s"), TTL_S) is not None
    await store.give_back([GiveBack(again)])
    assert await store.take(ask, replica_lease("two", 2, "{p}s"), TTL_S) is None
    keys = sorted([key.decode() async for key in client.scan_iter(match=f"{prefix}*")])
    assert keys == [f"{prefix}{LAYOUT}:{{p}}s"]


async def test_a_replica_not_queued_for_a_slot_is_refused_without_a_place_in_line(redis):
    """It is about to try another deployment: a slot set aside for it would idle."""
    _, prefix = redis
    clock = FakeClock()
    store = shared(prefix, clock)
    store.announce(["{p}s"])
    slots = (Slot("{p}s", 1),)
    held = replica_lease("one", 1, "{p}s")
    assert await store.take(Ask(slots=slots), held, TTL_S) is None
    assert await store.take(Ask(slots=slots), replica_lease("two", 1, "{p}s"), TTL_S) == (
        Refused(Part.SLOT, 0, None)
    )
    await store.give_back([GiveBack(held)])
    assert await store.take(Ask(slots=slots), replica_lease("three", 1, "{p}s"), TTL_S) is None


async def test_a_replica_refused_the_slot_set_aside_for_it_hands_it_on_at_once(redis):
    """Its request must leave more free (work beyond its share leaves the reserve): the
    slot goes to the next in line, announced again, instead of idling until it lapses."""
    _, prefix = redis
    clock = FakeClock()
    store = shared(prefix, clock)
    store.announce(["{p}s"])
    subscriber = listener(REDIS_URL, 5.0)
    heard: list[str] = []
    watching = asyncio.ensure_future(store.watch_releases(subscriber, heard.append, 0.1))
    try:
        whole = Ask(slots=(Slot("{p}s", 2),), queued=True)
        spared = Ask(slots=(Slot("{p}s", 1),), queued=True)
        held = [replica_lease("one", n, "{p}s") for n in (1, 2)]
        for lease_ in held:
            assert await store.take(whole, lease_, TTL_S) is None
        assert await store.take(spared, replica_lease("two", 1, "{p}s"), TTL_S) is not None
        clock.advance(0.01)
        assert await store.take(whole, replica_lease("four", 1, "{p}s"), TTL_S) is not None
        await asyncio.sleep(0.2)
        await store.give_back([GiveBack(held[0])])
        assert await store.take(spared, replica_lease("two", 2, "{p}s"), TTL_S) == Refused(
            Part.SLOT, 0, None
        )
        passing = Ask(slots=(Slot("{p}s", 2),))
        refused = await store.take(passing, replica_lease("three", 1, "{p}s"), TTL_S)
        assert refused == Refused(Part.SLOT, 0, pytest.approx(CLAIM_S))
        assert await store.take(whole, replica_lease("four", 2, "{p}s"), TTL_S) is None
        for _ in range(50):
            if len(heard) == 2:
                break
            await asyncio.sleep(0.02)
        assert heard == ["{p}s", "{p}s"]
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await subscriber.aclose()


async def test_a_replica_refused_again_keeps_its_place_in_line(redis):
    clock = FakeClock()
    store, ask, held = await one_holds_two_waits(redis[1], clock)
    clock.advance(1.0)
    assert await store.take(ask, replica_lease("three", 1, "{p}s"), TTL_S) is not None
    clock.advance(1.0)
    assert await store.take(ask, replica_lease("two", 2, "{p}s"), TTL_S) is not None
    await store.give_back([GiveBack(held)])
    assert await store.take(ask, replica_lease("three", 2, "{p}s"), TTL_S) is not None
    assert await store.take(ask, replica_lease("two", 3, "{p}s"), TTL_S) is None


async def test_lines_keep_their_keys_apart_from_cooldowns_other_slots_and_rates(redis):
    """A decision with every part, and two give-backs in one call with refunds: the
    line's keys sit after all of them, and the charges and refunds still land."""
    _, prefix = redis
    clock = FakeClock()
    store = shared(prefix, clock)
    store.announce(["{p}s"])
    rate = Rate(limit=60, period_s=60, burst=10)
    ask = Ask(
        ("{p}cool",),
        (Slot("{p}edge", 5), Slot("{p}s", 2)),
        (Charge("{p}r", rate, 1),),
        queued=True,
    )
    first = Lease("one:1", ("{p}edge", "{p}s"))
    second = Lease("one:2", ("{p}edge", "{p}s"))
    assert await store.take(ask, first, TTL_S) is None
    assert await store.take(ask, second, TTL_S) is None
    assert await store.take(ask, Lease("two:1", ("{p}edge", "{p}s")), TTL_S) == Refused(
        Part.SLOT, 1, None
    )
    assert await store.available("{p}r", rate) == pytest.approx(8)
    refund = (Refund(Charge("{p}r", rate, 1), 1),)
    await store.give_back([GiveBack(first, refund), GiveBack(second, refund)])
    assert await store.available("{p}r", rate) == pytest.approx(10)
    assert await store.take(ask, Lease("three:1", ("{p}edge", "{p}s")), TTL_S) is None
    refused = await store.take(ask, Lease("three:2", ("{p}edge", "{p}s")), TTL_S)
    assert refused == Refused(Part.SLOT, 1, pytest.approx(CLAIM_S))
    assert await store.take(ask, Lease("two:2", ("{p}edge", "{p}s")), TTL_S) is None


async def test_a_prefill_budget_is_the_fleet_s_and_announced_only_when_it_was_waited_for(redis):
    """Replica `two` is refused while `one`'s prompt prefills: `one`'s first token
    teaches the budget `two` is held to and is announced (`two` looks again at once);
    an end nobody waited for is not announced, so an idle budget costs the replicas no
    message per request. Each of the budget's keys has a TTL."""
    client, prefix = redis
    clock = FakeClock()
    one, two = shared(prefix, clock), shared(prefix, clock)
    subscriber = listener(REDIS_URL, 5.0)
    heard: list[str] = []
    watching = asyncio.ensure_future(two.watch_releases(subscriber, heard.append, 0.1))
    budget = keys.prefill("d")

    def ask(tokens: int) -> Ask:
        return Ask(slots=(Slot("{pools}s", 10),), prefill=Prefill(budget, tokens, 1.0))

    try:
        await asyncio.sleep(0.2)
        first = replica_lease("one", 1, "{pools}s")
        assert await one.take(ask(2_000), first, TTL_S) is None
        refused = await two.take(ask(2_000), replica_lease("two", 1, "{pools}s"), TTL_S)
        assert refused == Refused(Part.PREFILL, 0, None)
        clock.advance(0.125)
        state = await one.prefilled([PrefillEnd(budget, first.id, True)])
        assert state == {budget: PrefillState(0, pytest.approx(16_000))}
        again = replica_lease("two", 2, "{pools}s")
        assert await two.take(ask(2_000), again, TTL_S) is None
        clock.advance(0.125)
        await two.prefilled([PrefillEnd(budget, again.id, True)])
        for _ in range(50):
            if heard:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert heard == [budget]
        learnt = f"{prefix}{LAYOUT}:{budget}:learnt".encode()
        names = [key async for key in client.scan_iter(match=f"{prefix}*prefill*")]
        assert names == [learnt], "with no prompt counted, only the learnt rate is kept"
        assert 0 < await client.pttl(learnt) <= (LEARNT_KEPT_S + 2) * 1000
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await subscriber.aclose()


async def test_a_tenant_named_like_another_s_rate_keeps_its_own_keys(redis):
    """Tenant `a:requests` holding a slot while tenant `a` is charged its request rate:
    two keys of two types, neither refused nor broken by the other."""
    _, prefix = redis
    store = shared(prefix)
    rate = Ask(charges=(Charge(keys.tenant_requests("a"), RATE, 1),))
    slot = Ask(slots=(Slot(keys.tenant_slots("a:requests"), 1),))
    assert await store.take(rate, lease("rate"), TTL_S) is None
    assert await store.take(slot, lease("slot", keys.tenant_slots("a:requests")), TTL_S) is None
    assert await store.take(rate, lease("rate-2"), TTL_S) is None
    assert await store.in_use(keys.tenant_slots("a:requests")) == 1
    await store.close()


async def test_lost_release_notifications_are_logged_once_and_their_return_once(tmp_path, caplog):
    """Redis down used to log "release notifications lost" at every retry, four times a
    second per worker."""
    caplog.set_level(logging.INFO, logger="sluicegate")
    server = RedisServer(tmp_path / "redis")
    store = RedisLimitStore(RespConnection(server.url, 0.05), "x:", timeout_s=0.05)
    subscriber = listener(server.url, 0.05)
    watching = asyncio.ensure_future(store.watch_releases(subscriber, lambda key: None, 0.01))
    try:
        await asyncio.sleep(0.3)
        server.start()
        for _ in range(100):
            if "restored" in caplog.text:
                break
            await asyncio.sleep(0.05)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await subscriber.aclose()
        await store.close()
        server.kill()
    lines = [r.getMessage() for r in caplog.records if "release notifications" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("release notifications lost")
    assert re.fullmatch(r"release notifications restored after \d+ tries", lines[1])
    assert int(lines[1].split()[-2]) > 5
