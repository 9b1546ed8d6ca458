"""Fleet fairness on a fake clock against a scripted store: a replica holds back while
its least-served flow is ahead of a flow waiting elsewhere, orders its own flows alone
when the fleet's view is stale, and hands every charge over exactly once."""

from __future__ import annotations

from sluicegate.core.limits import StoreUnavailable
from sluicegate.scheduling.fleet_fairness import FairnessSync, FleetVirtualTokenCounter
from sluicegate.scheduling.queues import LaneQueue, Waiter
from tests.support.clock import FakeClock
from tests.unit.scheduling.test_dispatcher import attempt
from tests.unit.scheduling.test_promise import PROMISED

SYNC_S = 0.1


class ScriptedShares:
    """Keeps the charges it is sent; answers with them for this replica's waiting flows
    and with `fleet` for flows waiting elsewhere (set by the test); fails while `down`."""

    def __init__(self) -> None:
        self.fleet: dict[str, float] = {}
        self.counters: dict[str, float] = {}
        self.flying: dict[str, int] = {}
        """What the other replicas hold, in flight or queued (set by the test)."""
        self.down = False
        self.sent: list[tuple[dict[str, float], list[str], list[str]]] = []
        self.held: dict[str, int] = {}

    async def sync_fairness(self, name, replica, charged, waiting, idle, ttl_s, held):
        if self.down:
            raise StoreUnavailable("down")
        self.sent.append((dict(charged), list(waiting), list(idle)))
        self.held = dict(held)
        for flow, amount in charged.items():
            self.counters[flow] = self.counters.get(flow, 0.0) + amount
        counters = {**self.fleet, **{flow: self.counters.get(flow, 0.0) for flow in waiting}}
        return counters, dict(self.flying)


def make(
    queued: dict[str, int] | None = None,
) -> tuple[FleetVirtualTokenCounter, FairnessSync, ScriptedShares, FakeClock]:
    """A policy synced with `queued` as its lane's queue here (none by default)."""
    clock = FakeClock()
    policy = FleetVirtualTokenCounter("m:l", clock)
    store = ScriptedShares()
    counts = dict(queued or {})
    return (
        policy,
        FairnessSync([(policy, lambda: counts)], store, clock, "me", SYNC_S),
        store,
        clock,
    )


def served_a_hundred(policy: FleetVirtualTokenCounter) -> None:
    """`a` waits here and was served 100 units in dispatches of 10 (the slack is 20)."""
    policy.backlogged("a")
    for _ in range(10):
        policy.charge("a", 10, 0)


async def test_a_replica_ahead_of_a_flow_waiting_elsewhere_holds_back_until_it_catches_up():
    policy, sync, store, _ = make()
    served_a_hundred(policy)
    store.fleet = {"b": 0.0}
    await sync.sync_once()
    assert policy.pick() is None
    assert policy.held == 1
    store.fleet = {"b": 100.0}
    await sync.sync_once()
    assert policy.pick() == "a"


async def test_ahead_by_less_than_two_dispatches_it_goes_on():
    policy, sync, store, _ = make()
    served_a_hundred(policy)
    store.fleet = {"b": 85.0}
    await sync.sync_once()
    assert policy.pick() == "a"


async def test_with_a_stale_view_it_orders_its_own_flows_alone():
    policy, sync, store, clock = make()
    served_a_hundred(policy)
    store.fleet = {"b": 0.0}
    await sync.sync_once()
    assert policy.pick() is None
    clock.advance(2 * SYNC_S)
    assert policy.pick() == "a"


async def test_charges_and_idle_flows_of_a_failed_sync_go_with_the_next():
    policy, sync, store, _ = make()
    policy.backlogged("a")
    policy.charge("a", 30, 0)
    policy.idle("a")
    store.down = True
    await sync.sync_once()
    policy.charge("a", 10, 0)
    store.down = False
    await sync.sync_once()
    assert store.sent == [({"a": 40.0}, [], ["a"])]


async def test_a_flow_that_starts_waiting_is_lifted_to_the_least_counter_elsewhere():
    policy, sync, store, _ = make()
    store.fleet = {"b": 500.0}
    await sync.sync_once()
    policy.backlogged("a")
    assert policy.counters["a"] == 500.0


async def test_within_share_counts_what_the_other_replicas_hold():
    """`a` has 3 in flight and 1 queued here, `b` holds 5 on another replica, a batch of
    8: judged here alone, a's next request would be within its share (it looks like the
    only tenant); over the fleet a's share is 4 with 4 of a's before it, so it is not. A
    stale view falls back to this replica's own counts."""
    policy, sync, store, clock = make({"a": 1})
    policy.in_flight("a", 3)
    policy.backlogged("a")
    queued = {"a": 1}.get
    assert policy.within_share("a", lambda flow: queued(flow) or 0, 8)
    store.flying = {"b": 5}
    await sync.sync_once()
    assert store.held == {"a": 4}
    assert not policy.within_share("a", lambda flow: queued(flow) or 0, 8)
    clock.advance(3 * SYNC_S)
    assert policy.within_share("a", lambda flow: queued(flow) or 0, 8)


async def test_a_replica_hands_over_its_queued_requests_with_those_in_flight():
    """A burst of `a` that the kernel spread over two replicas is one demand: each
    replica tells the other what `a` holds there, queued as well as in flight, so the
    other does not judge its own half of the burst within a's share."""
    policy, _, store, clock = make()
    queue = LaneQueue(PROMISED, policy)
    sync = FairnessSync([(policy, queue.queued_counts)], store, clock, "me", SYNC_S)
    waiters = [Waiter(attempt(clock, "a", PROMISED), clock.now(), None) for _ in range(3)]
    for waiter in waiters:
        queue.push(waiter)
    policy.in_flight("a", 2)
    await sync.sync_once()
    assert store.held == {"a": 5}
    queue.remove(waiters[0])
    await sync.sync_once()
    assert store.held == {"a": 4}
