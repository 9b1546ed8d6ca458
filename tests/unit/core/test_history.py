"""The per-second history of offered, accepted and met requests: bounded, on the clock's
whole seconds, forgetting what left the window."""

from __future__ import annotations

from sluicegate.core.slo import Kind, LoadHistory
from tests.support.clock import FakeClock


def test_each_second_counts_offered_accepted_and_met():
    clock = FakeClock(start=100.2)
    history = LoadHistory(seconds=300)
    for kind in (Kind.MET, Kind.MISSED, Kind.FAILED, Kind.REFUSED, Kind.INVALID, Kind.ABANDONED):
        history.add(kind, clock.now())
    clock.advance(1.0)
    history.add(Kind.MET, clock.now())
    assert history.view(clock.now()) == {
        "now_s": 101,
        "seconds": {
            "100": {"offered": 6, "accepted": 3, "met": 1},
            "101": {"offered": 1, "accepted": 1, "met": 1},
        },
    }


def test_seconds_older_than_the_window_are_left_out():
    clock = FakeClock(start=50.0)
    history = LoadHistory(seconds=10)
    history.add(Kind.MET, clock.now())
    clock.advance(9.5)
    assert "50" in history.view(clock.now())["seconds"]
    clock.advance(0.5)
    assert history.view(clock.now()) == {"now_s": 60, "seconds": {}}


def test_the_ring_never_holds_more_seconds_than_the_window():
    clock = FakeClock(start=0.0)
    history = LoadHistory(seconds=5)
    for _ in range(50):
        history.add(Kind.MET, clock.now())
        clock.advance(1.0)
    assert len(history._ring) == 5
    assert sorted(history.view(clock.now() - 1.0)["seconds"]) == ["45", "46", "47", "48", "49"]
