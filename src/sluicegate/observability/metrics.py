"""Gateway metrics. Labels come from config (route, model, deployment) or closed sets.

Labelled children are bound once per label set and cached, so the hot path does a
dict lookup rather than prometheus_client's label resolution on every request.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

UNKNOWN_MODEL = "-"


def status_class(status: int) -> str:
    """A closed label set: 2xx..5xx, and `cancelled` for callers that went away."""
    return "cancelled" if status == 499 else f"{status // 100}xx"


@dataclass(frozen=True, slots=True)
class RouteMetrics:
    """The children bound to one (route, model)."""

    latency: Histogram
    ttft: Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        r = self.registry
        self._requests = Counter(
            "sluicegate_requests",
            "Requests answered, by outcome class.",
            ["route", "model", "status_class"],
            registry=r,
        )
        self._in_flight = Gauge(
            "sluicegate_requests_in_flight",
            "Requests being handled now.",
            ["route"],
            registry=r,
        )
        self._latency = Histogram(
            "sluicegate_request_duration_seconds",
            "Arrival to last byte sent, successful requests.",
            ["route", "model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self._ttft = Histogram(
            "sluicegate_time_to_first_token_seconds",
            "Arrival to the first streamed byte sent to the client.",
            ["route", "model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self._upstream_errors = Counter(
            "sluicegate_upstream_errors",
            "Failed upstream attempts, by normalised error code.",
            ["deployment", "code"],
            registry=r,
        )
        self._routes: dict[tuple[str, str], RouteMetrics] = {}
        self._outcomes: dict[tuple[str, str, int], Counter] = {}

    def route(self, route: str, model: str) -> RouteMetrics:
        key = (route, model)
        bound = self._routes.get(key)
        if bound is None:
            bound = RouteMetrics(
                self._latency.labels(route, model),
                self._ttft.labels(route, model),
            )
            self._routes[key] = bound
        return bound

    def in_flight(self, route: str) -> Gauge:
        return self._in_flight.labels(route)

    def answered(self, route: str, model: str, status: int) -> None:
        key = (route, model, status)
        counter = self._outcomes.get(key)
        if counter is None:
            counter = self._outcomes[key] = self._requests.labels(
                route, model, status_class(status)
            )
        counter.inc()

    def upstream_error(self, deployment: str, code: str) -> None:
        self._upstream_errors.labels(deployment, code).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
