from __future__ import annotations

import logging

import pytest

from sluicegate.capacity.gates import BackendSample, MetricsGate
from sluicegate.core.types import (
    BackendMetrics,
    Endpoint,
    Ladder,
    Lane,
    OverloadPolicy,
    OverloadState,
    Scheduling,
)
from sluicegate.scheduling.dispatcher import Dispatcher
from sluicegate.scheduling.fairness import RoundRobin
from sluicegate.scheduling.ladder import degrade
from sluicegate.scheduling.overload import OverloadMonitor, OverloadWatch, TtftWindow
from tests.support.clock import FakeClock

POLICY = OverloadPolicy(hold_s=5.0)
TOP = Lane("interactive", priority=100)
BOTTOM = Lane("background")


def chars(text: str) -> int:
    return -(-len(text) // 4)


def test_pressure_enters_states_at_their_thresholds():
    monitor = OverloadMonitor(POLICY, FakeClock())
    assert monitor.observe([0.5, None]) is OverloadState.NORMAL
    assert monitor.observe([0.75]) is OverloadState.DEGRADED
    assert monitor.observe([0.9, 0.1]) is OverloadState.BATCH_PAUSED
    assert monitor.observe([1.3]) is OverloadState.INTERACTIVE_ONLY
    assert monitor.pressure == 1.3


def test_states_are_left_one_step_at_a_time_after_a_calm_hold():
    clock = FakeClock()
    monitor = OverloadMonitor(POLICY, clock)
    monitor.observe([1.2])
    monitor.observe([0.0])
    clock.advance(4.9)
    assert monitor.observe([0.0]) is OverloadState.INTERACTIVE_ONLY
    clock.advance(0.2)
    assert monitor.observe([0.0]) is OverloadState.BATCH_PAUSED
    clock.advance(5.1)
    assert monitor.observe([0.0]) is OverloadState.DEGRADED


def test_hysteresis_a_dip_just_below_the_threshold_does_not_leave():
    clock = FakeClock()
    monitor = OverloadMonitor(POLICY, clock)
    monitor.observe([0.75])
    for _ in range(10):
        clock.advance(1.0)
        assert monitor.observe([0.65]) is OverloadState.DEGRADED
    clock.advance(1.0)
    monitor.observe([0.5])
    clock.advance(5.0)
    assert monitor.observe([0.5]) is OverloadState.NORMAL


def test_the_ttft_window_forgets_old_samples():
    clock = FakeClock()
    window = TtftWindow(clock, horizon_s=10)
    for value in (1, 2, 3, 4, 5):
        window.add(value)
    assert window.p95() == 5
    clock.advance(11)
    assert window.p95() is None


def test_ladder_drops_n_and_caps_interactive_output():
    payload = {
        "messages": [{"role": "user", "content": "hi"}],
        "n": 3,
        "best_of": 4,
        "max_tokens": 900,
    }
    actions = degrade(Ladder(interactive_max_tokens=100), TOP, TOP, Endpoint.CHAT, payload, chars)
    assert actions == ["drop_n", "cap_output"]
    assert (payload["n"], payload["max_tokens"]) == (1, 100)
    assert "best_of" not in payload
    other = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 900}
    assert (
        degrade(Ladder(interactive_max_tokens=100), BOTTOM, TOP, Endpoint.CHAT, other, chars) == []
    )


def test_ladder_trims_the_oldest_turns_but_keeps_system_and_the_last():
    messages = [
        {"role": "system", "content": "s" * 40},
        {"role": "user", "content": "a" * 400},
        {"role": "assistant", "content": "b" * 400},
        {"role": "user", "content": "c" * 40},
    ]
    payload = {"messages": messages}
    assert degrade(Ladder(trim_prompt_tokens=50), TOP, TOP, Endpoint.CHAT, payload, chars) == [
        "trim_prompt"
    ]
    assert [m["content"][0] for m in payload["messages"]] == ["s", "c"]


def test_trimming_counts_each_turn_once_however_many_it_drops():
    """A body of many tiny turns is trimmed in one pass: re-counting the whole prompt
    after each dropped turn would hold the event loop for the square of their number."""
    calls = 0

    def counting(text: str) -> int:
        nonlocal calls
        calls += 1
        return 1

    turns = 1000
    payload = {"messages": [{"role": "user", "content": "x"} for _ in range(turns)]}
    actions = degrade(Ladder(trim_prompt_tokens=10), TOP, TOP, Endpoint.CHAT, payload, counting)
    assert actions == ["trim_prompt"]
    assert len(payload["messages"]) == 2  # four strings, so four tokens, a turn
    assert calls <= 4 * turns


@pytest.mark.parametrize("endpoint", [Endpoint.EMBEDDINGS, Endpoint.COMPLETIONS])
def test_ladder_leaves_other_endpoints_prompts_alone(endpoint):
    payload = {"input": "x" * 1000, "prompt": "x" * 1000}
    assert degrade(Ladder(trim_prompt_tokens=5), TOP, TOP, endpoint, payload, chars) == []


def test_slow_decoding_counts_only_while_the_top_lane_has_requests_running():
    """A backend slowed by background prefills alone must not pause that background."""
    clock = FakeClock()
    top = Lane("interactive", priority=100, tpot_slo_s=0.1)
    scheduling = Scheduling(lanes=(top, BOTTOM))
    gate = MetricsGate(BackendMetrics("http://x/metrics"), clock)
    gate.update(BackendSample(0, 24, 0.5, tpot_sum=0.0, tpot_count=0))
    gate.update(BackendSample(0, 24, 0.5, tpot_sum=24 * 1.2, tpot_count=24))
    dispatcher = Dispatcher("m", scheduling.lanes, [], lambda lane: RoundRobin(), clock)
    monitor = OverloadMonitor(POLICY, clock)
    watch = OverloadWatch(monitor, scheduling, [dispatcher], [gate], TtftWindow(clock), clock)
    assert watch.tick() is OverloadState.NORMAL
    dispatcher.stats.lanes[top.name].in_flight = 1
    assert watch.tick() is OverloadState.INTERACTIVE_ONLY


def test_every_change_of_state_is_logged(caplog):
    caplog.set_level(logging.INFO, logger="sluicegate.overload")
    clock = FakeClock()
    monitor = OverloadMonitor(POLICY, clock)
    monitor.observe([0.75])
    monitor.observe([0.0])
    clock.advance(5)
    monitor.observe([0.0])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "overload state normal -> degraded (pressure 0.75)"),
        ("INFO", "overload state degraded -> normal (pressure 0.00)"),
    ]
