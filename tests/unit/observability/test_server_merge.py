"""Merging the workers' numbers into one page and one status document."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sluicegate.observability.metrics import GatewayMetrics, ServerFamilies
from sluicegate.observability.siblings import Seat, Siblings
from sluicegate.observability.status import whole_server


def families(text: bytes) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }


def worker(answered: int, waited_s: float) -> list:
    metrics = GatewayMetrics()
    for _ in range(answered):
        metrics.answered("chat", "m", 200)
    metrics.queue_waited("m", "interactive", waited_s, None, False)
    return orjson.loads(metrics.samples())


def test_counters_and_histograms_are_summed_across_workers():
    merged = ServerFamilies(2)
    merged.add(worker(3, 0.001))
    merged.add(worker(4, 20.0))
    page = families(generate_latest(merged))
    requests = ("model", "m"), ("route", "chat"), ("status_class", "2xx")
    assert page["sluicegate_requests_total", requests] == 7
    wait = ("lane", "interactive"), ("model", "m")
    assert page["sluicegate_queue_wait_seconds_count", wait] == 2
    assert page["sluicegate_queue_wait_seconds_sum", wait] == 20.001
    first = ("lane", "interactive"), ("le", "0.005"), ("model", "m")
    assert page["sluicegate_queue_wait_seconds_bucket", first] == 1  # cumulative: one worker
    assert page["sluicegate_workers", ()] == 2
    assert page["sluicegate_workers_reporting", ()] == 2


def test_shared_settings_take_the_largest_value_and_start_times_the_earliest():
    def gauge(name: str, value: float) -> list:
        return [[name, "gauge", "", [[name, {"pool": "p"}, value]]]]

    merged = ServerFamilies(3)
    merged.add(
        gauge("sluicegate_pool_concurrency_limit", 8) + gauge("process_start_time_seconds", 5)
    )
    merged.add(
        gauge("sluicegate_pool_concurrency_limit", 8) + gauge("process_start_time_seconds", 3)
    )
    merged.add(
        gauge("sluicegate_pool_active_attempts", 2) + gauge("sluicegate_queue_wait_tail", 1.5)
    )
    merged.add(
        gauge("sluicegate_pool_active_attempts", 5) + gauge("sluicegate_queue_wait_tail", 3.0)
    )
    page = families(generate_latest(merged))
    pool = (("pool", "p"),)
    assert page["sluicegate_queue_wait_tail", pool] == 3.0, "the worst worker's"
    assert page["sluicegate_pool_concurrency_limit", pool] == 8
    assert page["process_start_time_seconds", pool] == 3
    assert page["sluicegate_pool_active_attempts", pool] == 7
    assert page["sluicegate_workers_reporting", ()] == 4


class Reserved(Collector):
    """A sum of integers, as the pools' token reservations are, past 64 bits."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("sluicegate_pool_tokens_reserved", "", value=2**64 + 1)


def test_an_integer_past_64_bits_reaches_the_page_as_a_float():
    metrics = GatewayMetrics()
    metrics.registry.register(Reserved())
    merged = ServerFamilies(1)
    merged.add(orjson.loads(metrics.samples()))
    assert families(generate_latest(merged))["sluicegate_pool_tokens_reserved", ()] == 2.0**64


@pytest.mark.parametrize("answer", [b"", b'[["sluicegate_pool_active_attempts", "gauge", "", [['])
async def test_a_sibling_without_a_usable_answer_is_left_out_of_the_page(tmp_path: Path, answer):
    """A sibling that failed (nothing written) or died mid-answer is missing, as one that
    did not answer in time."""
    asking = Siblings(Seat(0, 2, tmp_path), lambda kind: b"")
    broken = Siblings(Seat(1, 2, tmp_path), lambda kind: answer)
    await broken.start()
    metrics = GatewayMetrics()
    metrics.share(asking)
    try:
        page = families(await metrics.page())
    finally:
        await broken.close()
    assert page["sluicegate_workers", ()] == 2
    assert page["sluicegate_workers_reporting", ()] == 1


def test_the_status_document_names_the_worker_and_merges_the_server():
    def doc(queued: int, age_s: float, circuit: str) -> dict:
        lane = {
            "queued": queued,
            "queue_dispatched": queued,
            "oldest_age_s": age_s,
            "wait_correction": age_s,
            "wait_tail": age_s,
            "shed": 1,
        }
        return {
            "models": {"m": {"lanes": {"l": lane}, "deployments": {"d": {"circuit": circuit}}}},
            "overload": {"state": "normal"},
            "answered": queued * 10,
        }

    status = whole_server(1, 3, {0: doc(2, 0.5, "closed"), 1: doc(3, 1.5, "open")})
    assert status["worker"] == 1
    assert status["workers"] == {"count": 3, "answered": [0, 1], "missing": [2]}
    server = status["server"]
    lane = {
        "queued": 5,
        "queue_dispatched": 5,
        "oldest_age_s": 1.5,
        "wait_correction": 1.5,
        "wait_tail": 1.5,
        "shed": 2,
    }
    assert server["models"]["m"]["lanes"]["l"] == lane
    assert server["models"]["m"]["deployments"]["d"]["circuit"] == ["closed", "open"]
    assert server["overload"]["state"] == "normal"
    assert server["answered"] == 50
    assert status["per_worker"]["1"]["answered"] == 30


def test_a_figure_one_worker_has_not_measured_yet_is_left_out_of_the_merge():
    def doc(pending: int, rate: float | None, gap_s: float | None) -> dict:
        deployment = {"prefill_pending_tokens": pending, "prefill_tokens_per_s": rate}
        return {"models": {"m": {"deployments": {"d": deployment}, "service_gap_s": gap_s}}}

    documents = {0: doc(100, None, None), 1: doc(50, 2000.0, None), 2: doc(0, 3000.0, None)}
    model = whole_server(0, 3, documents)["server"]["models"]["m"]
    assert model["deployments"]["d"] == {
        "prefill_pending_tokens": 150,
        "prefill_tokens_per_s": 3000.0,
    }
    assert model["service_gap_s"] is None


def test_the_status_page_figures_merge_as_the_metrics_do():
    """Each second's counts and a pool's attempts are summed; a pool's limit, its longest
    cooldown, the backend's scrape, the fair counters and the clock's second take the
    largest value, as the same families do on `/metrics`."""

    def doc(active: int, cooldown_s: float, running: float, service: float, now_s: int) -> dict:
        lane = {"queued": 1, "service": {"t": service}}
        backend = {"running": running, "waiting": 0.0, "kv_usage": 0.5, "tpot_s": None}
        return {
            "pools": {"p": {"active": active, "limit": 8, "cooldown_s": cooldown_s}},
            "models": {"m": {"lanes": {"l": lane}, "deployments": {"d": {"backend": backend}}}},
            "history": {
                "now_s": now_s,
                "seconds": {
                    str(now_s - 1): {"offered": 2, "accepted": 1, "met": 1},
                    str(now_s): {"offered": active, "accepted": active, "met": 0},
                },
            },
        }

    server = whole_server(0, 2, {0: doc(3, 0.0, 4.0, 10.0, 100), 1: doc(2, 1.5, 5.0, 12.0, 101)})[
        "server"
    ]
    assert server["pools"]["p"] == {"active": 5, "limit": 8, "cooldown_s": 1.5}
    model = server["models"]["m"]
    assert model["lanes"]["l"] == {"queued": 2, "service": {"t": 12.0}}
    assert model["deployments"]["d"]["backend"] == {
        "running": 5.0,
        "waiting": 0.0,
        "kv_usage": 0.5,
        "tpot_s": None,
    }
    assert server["history"] == {
        "now_s": 101,
        "seconds": {
            "99": {"offered": 2, "accepted": 1, "met": 1},
            "100": {"offered": 5, "accepted": 4, "met": 1},
            "101": {"offered": 2, "accepted": 2, "met": 0},
        },
    }


def test_the_pool_cooldown_and_backend_scrape_gauges_take_the_largest_value():
    def gauge(name: str, value: float) -> list:
        return [[name, "gauge", "", [[name, {"deployment": "d"}, value]]]]

    merged = ServerFamilies(2)
    for running, cooldown in ((4.0, 0.0), (5.0, 2.0)):
        merged.add(
            gauge("sluicegate_backend_running", running)
            + gauge("sluicegate_pool_cooldown_seconds", cooldown)
        )
    page = families(generate_latest(merged))
    deployment = (("deployment", "d"),)
    assert page["sluicegate_backend_running", deployment] == 5.0
    assert page["sluicegate_pool_cooldown_seconds", deployment] == 2.0


def test_cost_per_successful_request_is_a_ratio_of_the_workers_sums():
    def doc(successes: int, nanos: int) -> dict:
        lane = {
            "priced_successes": successes,
            "success_nanos": nanos,
            "cost_per_success_dollars": nanos / successes / 1e9,
        }
        spend = {"tenants": {"t": {"m": {"nanos": nanos}}}}
        return {"slo": {"models": {"m": {"l": lane}}}, "spend": spend}

    server = whole_server(0, 2, {0: doc(1, 9_000), 1: doc(3, 3_000)})["server"]
    assert server["slo"]["models"]["m"]["l"]["cost_per_success_dollars"] == 3e-6
    assert server["spend"]["tenants"]["t"]["m"]["nanos"] == 12_000


def test_the_deployments_without_a_price_read_the_same_in_the_servers_document():
    doc = {"spend": {"tenants": {}, "unpriced_deployments": "a, b"}}
    server = whole_server(0, 2, {0: doc, 1: doc})["server"]
    assert server["spend"]["unpriced_deployments"] == "a, b"
