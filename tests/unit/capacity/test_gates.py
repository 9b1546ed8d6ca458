from __future__ import annotations

import pytest

from sluicegate.capacity.gates import AimdGate, BackendSample, GateState, MetricsGate
from sluicegate.core.types import AdaptiveLimit, BackendMetrics, Lane
from tests.support.clock import FakeClock

INTERACTIVE = Lane("interactive", priority=100, max_backend_waiting=2, tpot_slo_s=0.15)
BACKGROUND = Lane("background", priority=0, max_backend_waiting=0, max_kv_usage=0.8)


def sample(waiting=0.0, running=0.0, kv=0.1, tpot_sum=0.0, tpot_count=0.0) -> BackendSample:
    return BackendSample(waiting, running, kv, tpot_sum, tpot_count)


def gate(on_stale="pools", max_num_seqs=None) -> tuple[MetricsGate, FakeClock]:
    clock = FakeClock()
    spec = BackendMetrics("http://x/metrics", 0.25, 1.0, on_stale, max_num_seqs)
    return MetricsGate(spec, clock), clock


def test_dispatch_while_the_backend_queue_is_within_the_lanes_bound():
    g, _ = gate()
    g.update(sample(waiting=2))
    assert g.admits(INTERACTIVE)
    assert not g.admits(BACKGROUND)
    g.sent()
    assert not g.admits(INTERACTIVE)


def test_background_only_into_an_empty_queue_counting_what_was_sent_since():
    g, _ = gate()
    g.update(sample(waiting=0))
    assert g.admits(BACKGROUND)
    g.sent()
    assert not g.admits(BACKGROUND)
    g.done(0.1)
    assert g.admits(BACKGROUND)
    g.sent()
    g.update(sample(waiting=0))
    assert g.admits(BACKGROUND)


def test_with_the_backends_batch_size_known_sends_fill_free_slots_before_they_wait():
    g, _ = gate(max_num_seqs=8)
    g.update(sample(waiting=0, running=5))
    for _ in range(4):
        assert g.admits(BACKGROUND)
        g.sent()
    assert g.estimated_waiting == 1
    assert not g.admits(BACKGROUND)
    g.done(0.1)
    assert g.admits(BACKGROUND)


def test_without_it_every_send_since_the_sample_counts_as_waiting():
    g, _ = gate()
    g.update(sample(waiting=0, running=5))
    g.sent()
    assert g.estimated_waiting == 1
    assert not g.admits(BACKGROUND)


def test_slow_decoding_closes_the_gate_for_a_lane_with_a_tpot_slo():
    g, _ = gate()
    g.update(sample(tpot_sum=1.0, tpot_count=10))
    g.update(sample(tpot_sum=1.0 + 20 * 0.2, tpot_count=30))
    assert g.tpot_s == pytest.approx(0.2)
    assert not g.admits(INTERACTIVE)
    g.update(sample(tpot_sum=5.0 + 10 * 0.05, tpot_count=40))
    assert g.admits(INTERACTIVE)


def test_kv_cache_ceiling():
    g, _ = gate()
    g.update(sample(kv=0.9))
    assert not g.admits(BACKGROUND)
    assert g.admits(INTERACTIVE)


@pytest.mark.parametrize(
    ("policy", "admits"), [("pools", True), ("hold", False), ("saturated", False)]
)
def test_a_stale_sample_does_what_the_setting_says(policy, admits):
    g, clock = gate(policy)
    assert g.state() is GateState.STALE
    assert g.admits(INTERACTIVE) is admits
    g.update(sample(waiting=0))
    assert g.state() is GateState.OPEN
    assert g.admits(INTERACTIVE)
    clock.advance(1.5)
    assert g.state() is GateState.STALE
    assert g.admits(INTERACTIVE) is admits


def test_listeners_hear_each_sample():
    g, _ = gate()
    heard = []
    g.on_change(lambda: heard.append(1))
    g.update(sample())
    assert heard == [1]


def test_aimd_grows_while_fast_and_in_use_and_shrinks_on_slow_answers():
    g = AimdGate(AdaptiveLimit(initial=4, minimum=1, maximum=10, latency_target_s=1.0))
    lane = Lane("x")
    for _ in range(40):
        while g.admits(lane):
            g.sent()
        g.done(0.1)
    assert g.limit == 10
    for _ in range(40):
        while g.admits(lane):
            g.sent()
        g.done(5.0)
    assert g.limit < 3
    assert g.limit >= 1


def test_a_withdrawn_send_wakes_nobody():
    """A send a pool refused leaves the gate as it was: waking the dispatcher for it would
    have it try the same request again at once, and again, as long as the pool refuses."""
    g = AimdGate(AdaptiveLimit(initial=4, minimum=1, maximum=10, latency_target_s=1.0))
    heard: list[int] = []
    g.on_change(lambda: heard.append(1))
    g.sent()
    g.withdraw()
    assert heard == []
    assert g.in_flight == 0
    g.sent()
    g.done(0.1)
    assert heard == [1], "an end may open it"


def fleet_gate(max_num_seqs=None) -> tuple[MetricsGate, FakeClock]:
    clock = FakeClock()
    spec = BackendMetrics("http://x/metrics", 0.25, 1.0, "pools", max_num_seqs)
    return MetricsGate(spec, clock, "{pools}backend:d"), clock


def sends_allowed_alone(g: MetricsGate, lane: Lane) -> int:
    """How many sends this replica's own estimate lets through from the last sample."""
    sent = 0
    while g.admits(lane):
        g.sent()
        sent += 1
    for _ in range(sent):
        g.withdraw()
    return sent


@pytest.mark.parametrize("max_num_seqs", [None, 8])
def test_in_a_fleet_the_bound_counts_every_replicas_sends_since_the_sample(max_num_seqs):
    """The fleet slot allows exactly the sends the replica's own estimate would, but over
    the whole fleet's attempts in flight, from their count at the sample."""
    g, _ = fleet_gate(max_num_seqs)
    g.update(sample(waiting=1, running=6), fleet_in_flight=5)
    for lane in (INTERACTIVE, BACKGROUND):
        slot = g.fleet_slot(lane)
        assert slot is not None
        assert slot.key == "{pools}backend:d"
        assert slot.limit == 5 + sends_allowed_alone(g, lane)


def test_in_a_fleet_attempts_counted_but_not_yet_seen_never_lift_the_bound_past_the_batch():
    """Counted at 3 in flight, scraped after one of them ended (2 running, none waiting):
    the sample leaves room for one send over 3, but the fleet's attempts can never
    usefully be more than the batch plus the lane's bound plus one send."""
    g, _ = fleet_gate(max_num_seqs=2)
    lane = Lane("interactive", max_backend_waiting=0)
    g.update(sample(waiting=0, running=2), fleet_in_flight=3)
    assert g.fleet_slot(lane) == (g.fleet_key, 3)
    g.update(sample(waiting=0, running=1), fleet_in_flight=1)
    assert g.fleet_slot(lane) == (g.fleet_key, 3), "one free sequence and one send over it"


def test_in_a_fleet_a_full_backend_leaves_no_room_and_a_stale_or_uncounted_sample_no_slot():
    g, clock = fleet_gate(max_num_seqs=4)
    g.update(sample(waiting=6, running=4), fleet_in_flight=9)
    assert sends_allowed_alone(g, INTERACTIVE) == 0
    assert g.fleet_slot(INTERACTIVE) == (g.fleet_key, 6), "4 queued over the bound: 3 must end"
    g.update(sample(waiting=0), fleet_in_flight=None)
    assert g.fleet_slot(INTERACTIVE) is None
    g.update(sample(waiting=0), fleet_in_flight=0)
    clock.advance(1.5)
    assert g.fleet_slot(INTERACTIVE) is None
    assert gate()[0].fleet_slot(INTERACTIVE) is None


def test_the_backends_prefix_hit_ratio_is_read_between_two_scrapes():
    """Hits over queries of the prompt tokens looked up since the last scrape; a scrape
    with no lookup keeps the last ratio rather than reading 0 of 0."""
    g, _ = gate()
    counters = [(None, None), (100.0, 40.0), (300.0, 190.0), (300.0, 190.0), (400.0, 190.0)]
    ratios = []
    for queries, hits in counters:
        g.update(BackendSample(0.0, 0.0, None, None, None, queries, hits))
        ratios.append(g.prefix_hit_ratio)
    assert ratios == [None, None, 0.75, 0.75, 0.0]


def test_the_view_is_the_last_scrape_with_the_time_per_token_between_the_last_two():
    g, _ = gate()
    assert g.view() is None
    g.update(sample(waiting=1, running=3, kv=0.25, tpot_sum=1.0, tpot_count=10))
    g.update(sample(waiting=2, running=4, kv=0.5, tpot_sum=1.5, tpot_count=20))
    g.sent()
    view = g.view()
    assert view is not None
    assert (view.running, view.waiting, view.kv_usage, view.tpot_s) == (4, 2, 0.5, 0.05)
