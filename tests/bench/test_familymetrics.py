"""A variant's figures and its capacity search, on hand-made records and a scripted probe."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from bench.family import capacity, metrics
from sluicegate.bench.client import queue_from_server_timing
from sluicegate.bench.records import Attempt, Record
from sluicegate.bench.scenario import Slo
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.sim.engine import EngineSettings

LANES = {"interactive": Slo(ttft_s=2.0)}


def served(
    start: float, ttft: float, tenant: str = "a", prefill: float = 0.05, asked: int = 100
) -> Record:
    attempt = Attempt(
        start, start + ttft + 1, 200, first_token_s=start + ttft, backend_prefill_s=prefill
    )
    return Record(tenant, "interactive", 0, True, start, (attempt,), asked, 10)


def refused_then_served(start: float, tenant: str = "a") -> Record:
    refusal = Attempt(start, start + 0.002, 503, "overloaded")
    ok = Attempt(start + 0.5, start + 1.5, 200, first_token_s=start + 0.7, backend_prefill_s=0.05)
    return Record(tenant, "interactive", 0, True, start, (refusal, ok), 100, 10)


def refused(start: float, tenant: str) -> Record:
    attempt = Attempt(start, start + 0.003, 503, "overloaded")
    return Record(tenant, "interactive", 0, True, start, (attempt,), 100, 10)


def unit_cost(record: Record) -> float:
    return 1.0


def basis(
    weights: Mapping[str, float],
    capacity: Mapping[str, float],
    duration_s: float,
    cost: metrics.Cost = unit_cost,
    batch: int = 8,
    step_s: float = 0.008,
) -> metrics.Basis:
    return metrics.Basis(LANES, weights, cost, capacity, batch, duration_s, 2.0, None, step_s)


def test_a_request_and_its_retry_count_once_in_goodput() -> None:
    records = [refused_then_served(0.0), served(1.0, 0.5)]
    found = metrics.figures(records, basis({"a": 1.0}, {"rps": 1.0, "work": 1.0}, 10.0))
    assert found["goodput_rps"] == pytest.approx(0.2)
    assert found["goodput_of_capacity"] == pytest.approx(0.2)
    assert found["admitted"] == 2
    assert found["refusals_at_once"] == 1
    assert found["refusal_p99_ms"] == pytest.approx(2.0)


def test_goodput_leaves_out_a_late_first_token_and_weighs_work() -> None:
    records = [served(0.0, 2.5, asked=100), served(1.0, 0.5, asked=300)]

    def by_tokens(record: Record) -> float:
        return record.asked_prompt_tokens / 100

    found = metrics.figures(records, basis({"a": 1.0}, {"rps": 1.0, "work": 3.0}, 1.0, by_tokens))
    assert found["goodput_rps"] == 1.0
    assert found["goodput_of_capacity"] == 1.0
    assert found["goodput_rps_of_capacity"] == 1.0
    assert found["admitted_ttft_p95_s"] > 2.0


def test_queue_wait_is_ttft_less_the_backends_prefill() -> None:
    assert served(0.0, 0.8, prefill=0.3).queue_wait_s == pytest.approx(0.5)
    plain = Record("a", "interactive", 0, True, 0.0, (Attempt(0.0, 1.0, 200, first_token_s=0.5),))
    assert plain.queue_wait_s is None


def test_tenants_below_their_share_get_wait_and_refusals_the_others_jain() -> None:
    small = [served(float(i), 0.3, "small", prefill=0.1) for i in range(4)]
    big = [served(float(i), 1.9, "big") for i in range(8)] + [refused(0.5, "big")] * 8
    heavy = [served(float(i), 1.9, "heavy") for i in range(2)] + [refused(0.5, "heavy")] * 14
    weights = {"small": 1.0, "big": 1.0, "heavy": 1.0}
    found = metrics.figures(small + big + heavy, basis(weights, {"rps": 9, "work": 13.0}, 1.0))
    tenants = found["tenants"]
    assert not tenants["small"]["above_share"]
    assert tenants["small"]["fair_share"] == 4.0
    assert tenants["big"]["above_share"]
    assert tenants["heavy"]["above_share"]
    assert tenants["big"]["fair_share"] == pytest.approx(4.5)
    assert tenants["big"]["refused_fraction"] == 0.5
    below = found["at_or_below_share"]
    assert below["tenants"] == 1
    assert below["queue_wait_p95_ms_max"] == pytest.approx(200.0)
    assert below["refused_fraction_max"] == 0.0
    # Served / share: big 8 / 4.5, heavy 2 / 4.5.
    x, y = 8 / 4.5, 2 / 4.5
    assert found["above_share"]["jain_served_of_share"] == pytest.approx(
        (x + y) ** 2 / (2 * (x * x + y * y))
    )
    assert found["predictor"] is None


def test_recovery_ends_with_the_last_window_that_broke_the_promise() -> None:
    records = [served(10.2, 1.0), served(11.5, 3.0), served(12.4, 2.5), served(13.3, 0.4)]
    found = metrics.recovery(records, 2.0, 10.0, 20.0)
    assert found["recovery_s"] == 3.0
    assert found["recovered"] is True
    assert found["windows_breached"] == 2


def test_recovery_is_zero_when_no_window_broke_and_unrecovered_at_the_end() -> None:
    assert metrics.recovery([served(10.5, 1.0)], 2.0, 10.0, 20.0)["recovery_s"] == 0.0
    late = metrics.recovery([served(19.5, 3.0)], 2.0, 10.0, 20.0)
    assert late["recovered"] is False
    assert late["recovery_s"] == 10.0


def test_pauses_are_the_longest_stand_still_of_answers_served_and_those_past_the_promise():
    """Of the answers that succeeded, the longest gap between two tokens and how many
    stood still longer than the 2 s promise; a refused attempt and an answer of one
    token (no gap) count for nothing."""

    def answer(gap_s: float | None, status: int = 200) -> Record:
        error = "ok" if status == 200 else "overloaded"
        attempt = Attempt(0.0, 9.0, status, error, first_token_s=0.5, longest_gap_s=gap_s)
        return Record("a", "interactive", 0, True, 0.0, (attempt,), 100, 10)

    records = [answer(0.4), answer(2.5), answer(3.1), answer(None), answer(9.0, 503)]
    found = metrics.figures(records, basis({"a": 1.0}, {"rps": 1.0, "work": 1.0}, 10.0))
    assert found["pauses"] == {"answers": 3, "longest_s": 3.1, "past_promise": 2}
    assert math.isnan(metrics.pauses([answer(None)], 2.0)["longest_s"])


def probe_at(limit: float) -> capacity.Measure:
    async def measure(rate: float) -> capacity.Probe:
        in_slo = 1.0 if rate <= limit else 0.5
        return capacity.Probe(rate, 100, in_slo, 0.1, 1.0)

    return measure


async def test_the_search_finds_the_highest_passing_rate_within_its_resolution() -> None:
    found = await capacity.search(probe_at(37.0), 100.0, 6)
    assert len(found.probes) == 6
    resolution = (capacity.BRACKET * capacity.ABOVE) ** (1 / 64)
    assert 37.0 / resolution <= found.rate_rps <= 37.0
    assert all(p.passed == (p.rate_rps <= 37.0) for p in found.probes)


async def test_short_probes_passing_above_the_ceiling_leave_the_capacity_at_the_ceiling() -> None:
    found = await capacity.search(probe_at(1000.0), 100.0, 5)
    assert found.best is not None
    assert 100.0 < found.best.rate_rps < 100.0 * capacity.ABOVE
    assert found.rate_rps == 100.0


async def test_below_the_bracket_the_search_halves_a_bounded_number_of_times() -> None:
    found = await capacity.search(probe_at(7.0), 100.0, 3)
    assert found.rate_rps == pytest.approx(100 / 8 / 2)
    nothing = await capacity.search(probe_at(0.1), 100.0, 3)
    assert math.isnan(nothing.rate_rps)
    assert len(nothing.probes) == 3 + capacity.EXTRA_STEPS


def test_a_probe_passes_only_with_99_percent_inside_the_slo() -> None:
    assert capacity.Probe(1.0, 100, 0.99, 0.1, 1.0).passed
    assert not capacity.Probe(1.0, 100, 0.98, 0.1, 1.0).passed
    assert not capacity.Probe(1.0, 0, 1.0, 0.1, 1.0).passed


def test_the_ceiling_is_a_full_batch_busy_all_the_time() -> None:
    settings = EngineSettings(max_num_seqs=10)
    cost = capacity.request_cost_s(settings, 1000, 100)
    # Prefill 1,000 x 50 us; 100 steps of 8 + 10 x 0.6 ms, shared by 10 sequences.
    assert cost == pytest.approx(0.05 + 100 * 0.014 / 10)
    assert capacity.ceiling_rps(settings, 1000, 100, 2.0) == pytest.approx(1 / (2 * cost))


def test_quantiles_of_a_histogram_are_interpolated_within_their_bucket() -> None:
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    found = metrics.histogram_quantiles(buckets, (50, 95, 10))
    assert found == {"p50": pytest.approx(0.1), "p95": pytest.approx(0.75), "p10": 0.02}
    assert math.isnan(metrics.histogram_quantiles([(1.0, 0.0)], (50,))["p50"])
    beyond = metrics.histogram_quantiles([(1.0, 1.0), (math.inf, 4.0)], (95,))
    assert beyond["p95"] == math.inf, "past the last bound: no bound to interpolate to"


def test_the_gateways_own_figures_are_read_from_its_metrics_page() -> None:
    gateway = GatewayMetrics()
    for _ in range(99):
        gateway.refused("chat", "overloaded", 503, 0.0008)
    gateway.refused("chat", "queue_full", 503, 0.2)
    gateway.refused("chat", "expired", 503, 9.0)
    for real, predicted in ((0.3, 0.2), (0.5, None), (1.0, 1.2)):
        gateway.queue_waited("m", "interactive", real, predicted, False)
    found = metrics.gateway_figures(gateway.exposition().decode())
    assert found["refusals"] == 100, "the expiry waited: not a refusal at once"
    assert 0.5 <= found["refusal_p99_ms"] <= 1.0
    predictor = found["predictor"]
    assert predictor["samples"] == 2, "only requests admitted on a prediction"
    assert 0.1 <= predictor["p95_s"] <= 0.25


PROTECTED_PAGE = """\
# TYPE sluicegate_protected_requests_total counter
sluicegate_protected_requests_total{model="m"} 40.0
# TYPE sluicegate_protected_refused_total counter
sluicegate_protected_refused_total{model="m",reason="expired"} 1.0
sluicegate_protected_refused_total{model="m",reason="overloaded"} 1.0
"""


def test_the_requests_the_gateway_judged_within_their_share_are_read_from_its_counts():
    """40 judged within, 2 refused (one expired, one overloaded); of the 38 dispatched,
    36 at once and 2 after 0.3 s: the p95 falls in the bucket up to 0.5 s. A page
    without the counts (an older gateway's) gives no figure."""
    gateway = GatewayMetrics()
    for wait_s in [0.0] * 36 + [0.3] * 2:
        gateway.queue_waited("m", "interactive", wait_s, None, True)
    gateway.queue_waited("m", "interactive", 9.0, None, False)
    page = gateway.exposition().decode()
    found = metrics.gateway_figures(page + PROTECTED_PAGE)["protected"]
    assert found["requests"] == 40
    assert found["refused_fraction"] == pytest.approx(0.05)
    assert found["refused_by_reason"] == {"expired": 1, "overloaded": 1}
    assert found["queue_wait_p95_ms"] == pytest.approx(262.5), "9 s beyond share would read 381"
    assert metrics.gateway_figures(page)["protected"] is None


QUEUE_PAGE = """\
# TYPE sluicegate_queue_dispatched_total counter
sluicegate_queue_dispatched_total{lane="interactive",model="m"} 5.0
sluicegate_queue_dispatched_total{lane="batch",model="m"} 1.0
# TYPE sluicegate_queue_expired_total counter
sluicegate_queue_expired_total{lane="interactive",model="m"} 2.0
sluicegate_queue_expired_total{lane="batch",model="m"} 0.0
# TYPE sluicegate_queue_shed_total counter
sluicegate_queue_shed_total{lane="interactive",model="m"} 2.0
"""


def test_the_share_of_queued_requests_refused_after_their_wait_is_the_gateways_count():
    """Ten queued over the lanes, four of them expired or shed. A page without the
    count of dispatches from a queue (an older gateway's) gives no figure."""
    found = metrics.gateway_figures(QUEUE_PAGE)["queue"]
    assert (found["queued"], found["unserved_fraction"]) == (10, pytest.approx(0.4))
    older = QUEUE_PAGE.replace("sluicegate_queue_dispatched", "sluicegate_other")
    assert metrics.gateway_figures(older)["queue"] is None


def test_a_burst_given_its_window_share_scores_one_below_share_on_average() -> None:
    steady = [served(0.1 * k, 0.3, "s") for k in range(2)] + [refused(0.0, "s")] * 2
    for w in (1, 2, 3):
        steady += [served(2.0 * w + 0.1 * k, 0.3, "s") for k in range(3)] + [refused(2.0 * w, "s")]
    burst = [served(0.5, 0.3, "b") for _ in range(2)] + [refused(0.5, "b") for _ in range(4)]
    found = metrics.figures(
        steady + burst, basis({"s": 1.0, "b": 1.0}, {"rps": 2.0, "work": 2.0}, 8.0)
    )
    # Over the run b asks 0.75/s of 2: below its share, so the first figures count its
    # refusals against the tenants at or below their share and leave it out of Jain.
    assert not found["tenants"]["b"]["above_share"]
    assert found["at_or_below_share"]["refused_fraction_max"] == pytest.approx(4 / 6)
    assert math.isnan(found["above_share"]["jain_served_of_share"])
    # In its window b asked 6 of 4 with s asking 4: both above, both served their 2.
    above = found["above_share"]
    assert above["tenants_windowed"] == 2
    assert above["jain_windowed"] == pytest.approx(1.0)
    # s alone in the later windows, at its share there: 3 of its 12 requests refused.
    windowed = found["at_or_below_share"]["windowed"]
    assert windowed["requests"] == 12
    assert windowed["refused_fraction"] == pytest.approx(0.25)


def test_within_share_at_send_judges_a_burst_by_the_batch_free_when_it_came() -> None:
    other = [served(0.1 * i, 0.3, "other", prefill=0.1) for i in range(4)]
    burst = [served(1.0, 0.3, "burst", prefill=0.1) for _ in range(2)]
    burst += [served(1.0, 5.0, "burst") for _ in range(4)] + [refused(1.0, "burst")] * 4
    weights = {"other": 1.0, "burst": 1.0}
    found = metrics.figures(other + burst, basis(weights, {"rps": 9, "work": 9.0}, 8.0, batch=4))
    within = found["within_share"]
    assert within["requests"] == 6
    assert within["queue_wait_p95_ms"] == pytest.approx(200.0)
    assert within["refused_fraction"] == 0.0
    assert within["per_tenant"]["burst"]["requests"] == 2
    assert within["per_tenant"]["other"]["requests"] == 4
    beyond = found["beyond_share"]
    assert beyond["requests"] == 8
    assert beyond["refused_fraction"] == 0.5


def test_refused_at_once_a_tenant_looks_within_its_share_at_send_but_not_by_demand() -> None:
    """Each refusal ends its request before the next comes, so at its send every request
    of a tenant asking ten times the capacity finds nothing of its own outstanding."""
    flood = [refused(0.1 * k, "a") for k in range(40)]
    found = metrics.figures(flood, basis({"a": 1.0}, {"rps": 1.0, "work": 1.0}, 4.0))
    within = found["within_share"]
    assert within["requests"] == 40
    assert within["asked_of_capacity"] == pytest.approx(10.0)
    windowed = found["at_or_below_share"]["windowed"]
    assert windowed["requests"] == 0
    assert windowed["asked_of_capacity"] == 0.0
    assert found["beyond_share"]["asked_of_capacity"] == 0.0


def test_the_windowed_class_says_which_of_its_requests_were_beyond_share_at_send() -> None:
    """`small` (weight 1 beside `big`'s 15, batch 8) asks for 2 of a window's 20: below
    its share there. But its second request overlaps its first while big holds 7, so at
    its send it is beyond its part of the batch (1); it was refused, and that refusal
    is where the class's comes from."""
    big = [served(0.0, 0.3, "big") for _ in range(7)]
    small = [served(0.05, 0.3, "small"), refused(0.1, "small")]
    weights = {"small": 1.0, "big": 15.0}
    found = metrics.figures(big + small, basis(weights, {"rps": 10, "work": 10.0}, 4.0))
    windowed = found["at_or_below_share"]["windowed"]
    assert windowed["requests"] == 9
    assert windowed["refusals_by_code"] == {"overloaded": 1}
    beyond = windowed["beyond_share_at_send"]
    assert beyond["requests"] == 1
    assert beyond["refused_fraction"] == 1.0
    assert found["within_share"]["refusals_by_code"] == {}


def test_the_gateways_part_of_a_wait_is_its_refusals_the_backoff_and_its_queue() -> None:
    """Refused at 0, sent again at 0.5 and held 0.1 s before dispatch: the gateway held it
    0.6 s of its 0.65 s wait; the rest (the engine step it came during) is the backend's."""
    refusal = Attempt(0.0, 0.002, 503, "overloaded")
    ok = Attempt(0.5, 1.5, 200, first_token_s=0.7, backend_prefill_s=0.05, gateway_queue_s=0.1)
    record = Record("a", "interactive", 0, True, 0.0, (refusal, ok), 100, 10)
    assert record.queue_wait_s == pytest.approx(0.65)
    assert record.gateway_wait_s == pytest.approx(0.6)
    group = metrics.figures([record], basis({"a": 1.0}, {"rps": 1.0, "work": 1.0}, 10.0))
    assert group["within_share"]["gateway_wait_p95_ms"] == pytest.approx(600)


def test_the_client_reads_the_gateways_queue_from_server_timing() -> None:
    assert queue_from_server_timing("queue;dur=12.5, upstream;dur=300.0") == pytest.approx(0.0125)
    both = "admission;dur=0.5, queue;dur=12.5, upstream;dur=300.0"
    assert queue_from_server_timing(both) == pytest.approx(0.013)
    assert queue_from_server_timing("admission;dur=3") is None
    assert queue_from_server_timing("upstream;dur=3") is None
    assert queue_from_server_timing(None) is None
    assert queue_from_server_timing("queue;dur=x") is None


def burst(count: int, at: float, tenant: str = "a", output: int = 16) -> list[Record]:
    attempt = Attempt(at, at + 1.0, 200, first_token_s=at + 0.5, backend_prefill_s=0.05)
    record = Record(
        tenant,
        "interactive",
        0,
        True,
        at,
        (attempt,),
        asked_prompt_tokens=100,
        asked_output_tokens=output,
    )
    return [record] * count


def test_a_burst_beyond_the_batch_is_out_of_any_schedulers_reach() -> None:
    """16 tokens at 8 ms hold a slot 128 ms: of 12 sent at once on 8 slots, 4 wait past
    100 ms whatever the order, and the tenant asks no more than its share."""
    found = metrics.figures(burst(12, 1.0), basis({"a": 1.0}, {"rps": 100.0, "work": 100.0}, 10.0))
    assert found["tenants"]["a"]["beyond_reach_fraction"] == pytest.approx(4 / 12)
    below = found["at_or_below_share"]
    assert below["tenants"] == 1
    assert below["beyond_reach_fraction_max"] == pytest.approx(4 / 12)
    assert below["windowed"]["beyond_reach_fraction"] == pytest.approx(4 / 12)


def test_the_runs_shortest_answer_sets_the_span_a_slot_may_free_in() -> None:
    """The run's fewest output tokens bound every slot's hold, the cautious end: with one
    answer of a single token in the run, nothing is beyond reach."""
    records = [*burst(12, 1.0), *burst(1, 5.0, tenant="b", output=1)]
    found = metrics.figures(
        records, basis({"a": 1.0, "b": 1.0}, {"rps": 100.0, "work": 100.0}, 10.0)
    )
    assert found["tenants"]["a"]["beyond_reach_fraction"] == 0.0
