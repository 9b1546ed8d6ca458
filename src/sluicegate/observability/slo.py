"""How well is each lane and tenant served? Every finished request's verdict, counted.

Each request is counted once, when it ends, in the Prometheus families (for goodput and
attainment over any range) and in a window of the last minutes (for `/admin/status`).
The window's keys are lanes of configured models and configured tenants, so it stays
bounded.
"""

from __future__ import annotations

from typing import Any

from sluicegate.core.clock import Clock
from sluicegate.core.slo import LoadHistory, RecentOutcomes, Timeline, Verdict, figures
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.spend.prices import NANOS, cost_per_success

UNKNOWN = "-"
"""The model or lane of a request refused before either was known."""

WINDOW_S = 300.0
"""How far back `/admin/status` counts outcomes."""


class SloAccounts:
    def __init__(self, metrics: GatewayMetrics, clock: Clock, window_s: float = WINDOW_S) -> None:
        self._metrics = metrics
        self._clock = clock
        self._recent = RecentOutcomes(window_s)
        self._history = LoadHistory()
        self._costs: dict[tuple[str, str], list[int]] = {}
        """Per model and lane: successful requests priced, and their cost (nanodollars)."""

    def finished(
        self, route: str, model: str, lane: str, tenant: str | None, verdict: Verdict
    ) -> None:
        """One request ended with `verdict`; `tenant` None when it was never known."""
        outcome, kind = verdict
        self._metrics.judged(route, model, lane, tenant, outcome, kind)
        now, recent = self._clock.now(), self._recent
        self._history.add(kind, now)
        recent.add(("lane", model, lane), kind, now)
        if tenant is not None:
            recent.add(("tenant", tenant, lane), kind, now)

    def answered(
        self,
        route: str,
        model: str,
        lane: str,
        timeline: Timeline,
        streamed: bool,
        tpot_s: float | None,
    ) -> None:
        """A successful request's timings, its answer's end being now."""
        bound = self._metrics.lane(route, model, lane)
        now = self._clock.now()
        bound.latency.observe(now - timeline.arrived_s)
        first = timeline.first_byte_s
        if first is None:
            return
        bound.ttft.observe(first - timeline.arrived_s)
        stages = bound.stages
        for stage, took_s in timeline.stages(now):
            stages[stage].observe(took_s)
        if streamed:
            bound.stream.observe(now - first)
        if tpot_s is not None:
            bound.tpot.observe(tpot_s)

    def spent(
        self, route: str, model: str, lane: str, used_tokens: int, completion_tokens: int | None
    ) -> None:
        """The tokens an accepted request's answer used, as its deployment reported them,
        whether or not it succeeded."""
        bound = self._metrics.lane(route, model, lane)
        completion = completion_tokens or 0
        bound.prompt_tokens.inc(max(used_tokens - completion, 0))
        bound.completion_tokens.inc(completion)

    def priced(self, model: str, lane: str, nanos: int) -> None:
        """A successful request's cost, all its attempts included."""
        self._metrics.success_cost(model, lane, nanos / NANOS)
        tally = self._costs.get((model, lane))
        if tally is None:
            tally = self._costs[(model, lane)] = [0, 0]
        tally[0] += 1
        tally[1] += nanos

    def view(self) -> dict[str, Any]:
        """Outcomes over the window, per lane of each model and per tenant and lane; next
        to each lane's goodput, its cost per successful request since the start."""
        window_s = self._recent.window_s
        lanes: dict[str, dict[str, Any]] = {}
        tenants: dict[str, dict[str, Any]] = {}
        for (scope, name, lane), tally in self._recent.totals(self._clock.now()).items():
            into = lanes if scope == "lane" else tenants
            into.setdefault(name, {})[lane] = figures(tally, window_s)
        for (model, lane), (count, nanos) in self._costs.items():
            shown = lanes.setdefault(model, {}).setdefault(lane, {})
            shown["priced_successes"] = count
            shown["success_nanos"] = nanos
            shown["cost_per_success_dollars"] = cost_per_success(nanos, count)
        return {"window_s": window_s, "models": lanes, "tenants": tenants}

    def history(self) -> dict[str, Any]:
        """Offered, accepted and met requests per second over the last minutes, counted
        where `sluicegate_request_outcomes_total` counts them."""
        return self._history.view(self._clock.now())
