"""Goodput counts distinct requests inside their lane's SLOs, whatever their retries."""

from __future__ import annotations

import pytest

from sluicegate.bench.records import OK, Attempt, Record
from sluicegate.bench.scenario import Slo
from sluicegate.bench.summary import goodput_rps, load, meets, slo_accounting, statuses

LANES = {"chat": Slo(ttft_s=1.0, tpot_s=0.1), "batch": Slo(e2e_s=10.0)}


def refused(at_s: float) -> Attempt:
    return Attempt(at_s, at_s + 0.001, 503, "capacity_exhausted")


def streamed(at_s: float, first_s: float, last_s: float, tokens: int = 11) -> Attempt:
    return Attempt(at_s, last_s, 200, OK, None, None, first_s, last_s, 10, tokens)


def record(*attempts: Attempt, lane: str = "chat", stream: bool = True) -> Record:
    return Record("t", lane, 0, stream, attempts[0].start_s, attempts)


RETRIED_IN_SLO = record(refused(0.0), refused(0.1), streamed(0.2, 0.5, 1.0))
RETRIED_TOO_LONG = record(refused(0.0), streamed(0.9, 1.3, 1.8))
SLOW_TOKENS = record(streamed(0.0, 0.2, 3.0))
FAILED = record(refused(0.0), refused(0.5))
BATCH = record(refused(0.0), Attempt(1.0, 5.0, 200, OK), lane="batch", stream=False)


def test_a_request_and_its_retries_count_once():
    assert goodput_rps([RETRIED_IN_SLO], LANES, duration_s=2.0) == 0.5
    summary = load([RETRIED_IN_SLO, BATCH], LANES, duration_s=2.0, capacity_rps=4.0)
    assert summary["requests"] == 2
    assert summary["attempts"] == 5
    assert summary["offered_rps"] == 1.0
    assert summary["attempts_rps"] == 2.5
    assert summary["goodput_rps"] == 1.0
    assert summary["goodput_of_capacity"] == 0.25


def test_ttft_runs_from_the_first_send_so_retries_can_break_the_slo():
    assert RETRIED_IN_SLO.ttft_s == pytest.approx(0.5)
    assert RETRIED_TOO_LONG.ttft_s == pytest.approx(1.3)
    assert not meets(RETRIED_TOO_LONG, LANES["chat"])


def test_each_slo_of_the_lane_must_hold():
    assert SLOW_TOKENS.tpot_s == pytest.approx(0.28)
    assert not meets(SLOW_TOKENS, LANES["chat"])
    assert not meets(FAILED, LANES["chat"])
    assert meets(BATCH, LANES["batch"])
    assert BATCH.ttft_s == pytest.approx(5.0)
    assert BATCH.tpot_s is None


def test_accepted_counts_successes_whatever_their_slo():
    records = [RETRIED_IN_SLO, RETRIED_TOO_LONG, SLOW_TOKENS, FAILED]
    summary = load(records, LANES, duration_s=1.0, capacity_rps=None)
    assert summary["accepted_rps"] == 3.0
    assert summary["goodput_rps"] == 1.0
    assert summary["goodput_of_capacity"] is None


def test_statuses_count_final_outcomes_and_every_attempt():
    counted = statuses([RETRIED_IN_SLO, FAILED])
    assert counted["requests"] == {"200 ok": 1, "503 capacity_exhausted": 1}
    assert counted["attempts"] == {"503 capacity_exhausted": 4, "200 ok": 1}


GATEWAY_LANES = [{"name": "chat", "ttft_slo_s": 1.0, "tpot_slo_s": 0.1}, {"name": "batch"}]


def once(first_s: float, lane: str = "chat") -> Record:
    """A stream sent once, its first token at `first_s`, its tokens quick."""
    return record(streamed(0.0, first_s, first_s + 0.5), lane=lane)


def test_the_gateways_met_count_agrees_within_the_requests_near_the_slo():
    """Two of five clients' TTFTs lie within 10 ms of the SLO: the gateway may count
    either side of them."""
    records = [once(0.2), once(0.3), once(0.995), once(1.005), once(2.0)]
    lanes = {"chat": LANES["chat"]}
    for gateway_met, agrees in ((3, True), (1, True), (5, True), (0, False)):
        counted = {"chat": {"met": float(gateway_met), "missed": 5.0 - gateway_met}}
        found = slo_accounting(records, lanes, counted, GATEWAY_LANES)
        assert found == {
            "chat": {"client_met": 3, "gateway_met": gateway_met, "near_slo": 2, "agrees": agrees}
        }


def test_the_counts_are_not_compared_after_retries_or_with_other_slos():
    lanes = {"chat": LANES["chat"]}
    counted = {"chat": {"met": 1.0}}
    retried = slo_accounting([RETRIED_IN_SLO], lanes, counted, GATEWAY_LANES)
    assert retried is not None
    assert retried["chat"]["agrees"] is None
    other = [{"name": "chat", "ttft_slo_s": 2.0, "tpot_slo_s": 0.1}]
    unlike = slo_accounting([once(0.2)], lanes, counted, other)
    assert unlike is not None
    assert unlike["chat"]["agrees"] is None
    assert slo_accounting([once(0.2)], lanes, None, GATEWAY_LANES) is None
