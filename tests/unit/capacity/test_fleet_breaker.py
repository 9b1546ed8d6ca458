"""A fleet breaker on a fake clock, against a scripted store that answers with the
fleet's circuit: the fleet decides while its view is fresh, this replica's own counts
decide when it is not, and outcomes are handed over exactly once."""

from __future__ import annotations

import pytest

from sluicegate.capacity.breaker import BreakerState
from sluicegate.capacity.fleet_breaker import BreakerSync, FleetBreaker, Tally
from sluicegate.core.limits import StoreUnavailable
from sluicegate.core.types import BreakerPolicy
from tests.support.clock import FakeClock

POLICY = BreakerPolicy(consecutive_failures=2, open_s=5.0, ramp_s=0)
SYNC_S = 0.1


class ScriptedCircuits:
    """Answers every sync with `answer` (or fails while `down`); keeps what it was sent."""

    def __init__(self) -> None:
        self.answer: tuple[str, float, bool] = ("closed", 0.0, False)
        self.down = False
        self.sent: list[tuple[int, int, int, bool | None]] = []

    async def sync_breaker(self, name, replica, outcomes, policy):
        if self.down:
            raise StoreUnavailable("down")
        self.sent.append(outcomes)
        return self.answer


def make() -> tuple[FleetBreaker, BreakerSync, ScriptedCircuits, FakeClock]:
    clock = FakeClock()
    breaker = FleetBreaker("d", POLICY, clock, jitter=lambda: 0.5)
    store = ScriptedCircuits()
    return breaker, BreakerSync([breaker], store, clock, "me", SYNC_S), store, clock


def attempt(breaker: FleetBreaker, ok: bool) -> None:
    breaker.started()
    breaker.record(ok)


async def test_a_circuit_opened_elsewhere_refuses_here_until_the_fleet_reopens_it():
    breaker, sync, store, clock = make()
    store.answer = ("open", 4.0, False)
    await sync.sync_once()
    assert not breaker.allows()
    assert breaker.reopens_in() == pytest.approx(4.0)
    store.answer = ("half_open", 0.0, False)
    clock.advance(SYNC_S)
    await sync.sync_once()
    assert not breaker.allows()
    store.answer = ("half_open", 0.0, True)
    await sync.sync_once()
    assert breaker.allows()
    breaker.started()
    assert not breaker.allows()
    breaker.record(True)
    await sync.sync_once()
    assert store.sent[-1] == (0, 0, 0, True)


async def test_while_the_fleet_decides_local_failures_do_not_trip_the_circuit_alone():
    breaker, sync, store, _ = make()
    await sync.sync_once()
    for _ in range(3):
        attempt(breaker, False)
    assert breaker.state is BreakerState.CLOSED
    await sync.sync_once()
    assert store.sent[-1] == (0, 3, 3, None)


async def test_a_stale_fleet_view_leaves_the_decision_to_this_replica():
    breaker, sync, store, clock = make()
    await sync.sync_once()
    store.down = True
    clock.advance(3 * SYNC_S)
    await sync.sync_once()
    attempt(breaker, False)
    attempt(breaker, False)
    assert breaker.state is BreakerState.OPEN
    assert sync.failures == 1


async def test_outcomes_of_a_failed_sync_go_with_the_next_one():
    breaker, sync, store, _ = make()
    attempt(breaker, False)
    store.down = True
    await sync.sync_once()
    attempt(breaker, True)
    attempt(breaker, False)
    store.down = False
    await sync.sync_once()
    assert store.sent == [(1, 2, 1, None)]


async def test_the_fleet_closing_the_circuit_closes_it_here():
    breaker, sync, store, _ = make()
    store.answer = ("open", 1.0, False)
    await sync.sync_once()
    store.answer = ("closed", 0.0, False)
    await sync.sync_once()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allows()


def test_tallies_merge_in_order():
    first = Tally(ok=1, failed=2, trailing_failures=2)
    assert first.merge(Tally(failed=1, trailing_failures=1)).trailing_failures == 3
    assert first.merge(Tally(ok=1)).trailing_failures == 0
