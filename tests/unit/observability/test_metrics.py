"""The plain families are exposed exactly as prometheus_client's own types would be."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sluicegate.observability.metrics import (
    CounterChild,
    GaugeChild,
    PlainFamily,
    buckets,
)

BOUNDS = (0.0, 0.005, 0.5, 10.0)
SAMPLES = (0.0, 0.003, 0.005, 0.2, 7.0, 11.0, 1e9)


@pytest.fixture(autouse=True)
def fixed_time(monkeypatch):
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.25)


def test_a_labelled_histogram_matches_prometheus_client():
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    native = Histogram("h_seconds", "A histogram.", ["a", "b"], buckets=BOUNDS, registry=theirs)
    plain = PlainFamily("h_seconds", "A histogram.", "histogram", ("a", "b"), buckets(BOUNDS), ours)
    native.labels("x", "y")
    plain.labels("x", "y")
    for value in SAMPLES:
        native.labels("p", "q").observe(value)
        plain.labels("p", "q").observe(value)
    assert generate_latest(ours) == generate_latest(theirs)


def test_an_unlabelled_histogram_is_exposed_before_its_first_observation():
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    native = Histogram("n", "Counts.", buckets=(1, 2, 5), registry=theirs)
    plain = PlainFamily("n", "Counts.", "histogram", (), buckets((1, 2, 5)), ours)
    assert generate_latest(ours) == generate_latest(theirs)
    native.observe(2)
    plain.labels().observe(2)
    assert generate_latest(ours) == generate_latest(theirs)


def test_counters_and_gauges_match_prometheus_client():
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counter = Counter("c", "Counted.", ["route", "status"], registry=theirs)
    gauge = Gauge("g", "Now.", ["route"], registry=theirs)
    plain_counter = PlainFamily("c", "Counted.", "counter", ("route", "status"), CounterChild, ours)
    plain_gauge = PlainFamily("g", "Now.", "gauge", ("route",), GaugeChild, ours)
    assert generate_latest(ours) == generate_latest(theirs)
    for route, status in (("chat", "2xx"), ("chat", "4xx"), ("embed", "2xx"), ("chat", "2xx")):
        counter.labels(route, status).inc()
        plain_counter.labels(route, status).inc()
        gauge.labels(route).inc()
        plain_gauge.labels(route).inc()
    gauge.labels("chat").dec()
    plain_gauge.labels("chat").dec()
    assert generate_latest(ours) == generate_latest(theirs)
