"""A family variant's figures, from one run's records: pure functions, like `summary`.

Each figure is the issue's definition, computed from what the client saw, except where
the gateway exposes its own measure: the predictor's error is read from the gateway's
histogram of it; refusals the gateway does not time, so their time is the client's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from bench.family import shares
from sluicegate.bench.records import Record
from sluicegate.bench.scenario import Slo
from sluicegate.bench.stats import jain, percentile
from sluicegate.bench.summary import REFUSALS, WAITED, goodput_rps, meets

Cost = Callable[[Record], float]
"""A request's work: seconds of a full backend batch (`capacity.request_cost_s`)."""
Reach = Callable[[Sequence[Record]], float]
"""The fraction of a class of requests beyond any scheduler's reach (`_reach`); NaN for
an empty class."""

WINDOW_S = 1.0
SHARE_WAIT_S = 0.1
"""The queue wait the issue allows requests of tenants at or below their share (p95)."""
PREDICTOR_ERROR = "sluicegate_queue_wait_prediction_error_seconds"
GATEWAY_REFUSALS = "sluicegate_refusal_seconds"
QUEUE_OUTCOMES = (
    "sluicegate_queue_dispatched",
    "sluicegate_queue_expired",
    "sluicegate_queue_shed",
)
QUEUE_SOURCE = (
    "gateway: of the requests it queued, the share it refused after their wait (expired, "
    "deadline_exceeded, shed) rather than dispatched, from its counters "
    "sluicegate_queue_{dispatched,expired,shed}_total: a request the queue cannot serve in "
    "time is better refused at once; requests whose callers left, and those answered "
    "from the queue when every deployment named a time past their wait (an open "
    "circuit), are in neither part (sluicegate_queue_{abandoned,unavailable}_total)"
)
GATEWAY_REFUSAL_SOURCE = (
    f"gateway: arrival to refusal, from its histogram {GATEWAY_REFUSALS}, every reason but "
    "those given after a wait in a queue (expired, deadline_exceeded, shed)"
)
PREDICTOR_SOURCE = (
    "gateway: |real - predicted| queue wait of each request dispatched from a queue, from "
    f"its histogram {PREDICTOR_ERROR} read after the run; quantiles interpolated linearly "
    "within the histogram's buckets"
)
PROTECTED_WAIT = "sluicegate_protected_wait_seconds"
PROTECTED_COUNTS = ("sluicegate_protected_requests", "sluicegate_protected_refused")
PROTECTED_SOURCE = (
    "gateway: the top-lane requests it judged within their tenant's share on arrival "
    "(the ones it keeps reserved slots and hand-overs for), how many it refused, at once "
    "or after a wait (by refusal code where the gateway labels them), from its counters "
    "sluicegate_protected_{requests,refused}_total, and "
    f"the p95 of its own queue wait of those it dispatched ({PROTECTED_WAIT}, 0 for those "
    "sent at once, interpolated within buckets): the share's promise by the gateway's own "
    "verdict, the backend's queue not counted; a retry the client announces is never "
    "judged within, an unannounced one is a new arrival"
)
REFUSAL_SOURCE = (
    "client: send to end of an attempt the gateway refused at once (its own refusal codes "
    "but those given after a wait in a queue: expired, deadline_exceeded, shed), as the "
    "client saw it over loopback"
)


def histogram_quantiles(
    buckets: Sequence[tuple[float, float]], quantiles: Sequence[float]
) -> dict[str, float]:
    """Quantiles (in %) of a cumulative histogram given as (upper bound, count) pairs,
    interpolated linearly within a bucket, as Prometheus' histogram_quantile does; NaN
    when it counted nothing."""
    ordered = sorted(buckets)
    total = ordered[-1][1] if ordered else 0.0
    found: dict[str, float] = {}
    for q in quantiles:
        rank, lower, below, value = total * q / 100, 0.0, 0.0, math.nan
        for upper, count in ordered:
            if total > 0 and count >= rank:
                value = upper if math.isinf(upper) else lower
                if not math.isinf(upper) and count > below:
                    value = lower + (upper - lower) * (rank - below) / (count - below)
                break
            lower, below = upper, count
        found[f"p{q:g}"] = value
    return found


def histogram_buckets(
    exposition: str, name: str, keep: Callable[[Mapping[str, str]], bool] = lambda _: True
) -> list[tuple[float, float]]:
    """(upper bound, count) of the histogram `name` in a /metrics page, summed over the
    label sets `keep` accepts."""
    counts: dict[float, float] = defaultdict(float)
    for _, samples in _families(exposition, (name,), "_bucket"):
        for sample in samples:
            if keep(sample.labels):
                counts[float(sample.labels["le"])] += sample.value
    return sorted(counts.items())


def counter_by_label(exposition: str, name: str, label: str) -> dict[str, float]:
    """The counter `name` in a /metrics page summed per value of `label`; samples without
    that label (an older gateway's) are left out."""
    found: dict[str, float] = defaultdict(float)
    for _, samples in _families(exposition, (name,), "_total"):
        for sample in samples:
            if label in sample.labels:
                found[sample.labels[label]] += sample.value
    return dict(sorted(found.items()))


def counter_totals(exposition: str, names: Sequence[str]) -> dict[str, float]:
    """The counters `names` in a /metrics page, each summed over its label sets; a counter
    the page does not have is left out (one it has without samples is 0)."""
    return {
        name: sum(sample.value for sample in samples)
        for name, samples in _families(exposition, names, "_total")
    }


def _families(
    exposition: str, names: Sequence[str], suffix: str
) -> Iterator[tuple[str, list[Sample]]]:
    """Each family of `names` the page has, with its samples named `name + suffix`."""
    for metric in text_string_to_metric_families(exposition):
        if metric.name in names:
            yield metric.name, [s for s in metric.samples if s.name == metric.name + suffix]


GATEWAY_KEYS = (
    "predictor",
    "gateway_queue",
    "gateway_refusals",
    "gateway_refusal_p99_ms",
    "gateway_protected",
)
"""The figures `gateway_figures` gives, as `figures` names them."""


def gateway_figures(exposition: str) -> dict[str, object]:
    """What the gateway measured itself: the predictor's error, how many of the requests
    it queued it refused after their wait, how long refusals other than the queue's
    took, and what became of the requests it judged within their share."""
    error = histogram_buckets(exposition, PREDICTOR_ERROR)
    quantiles = histogram_quantiles(error, (50, 95))
    refusals = histogram_buckets(
        exposition, GATEWAY_REFUSALS, lambda labels: labels["reason"] not in WAITED
    )
    return {
        "predictor": {
            "samples": max((count for _, count in error), default=0.0),
            "p50_s": quantiles["p50"],
            "p95_s": quantiles["p95"],
            "source": PREDICTOR_SOURCE,
        },
        "queue": _queue_outcomes(counter_totals(exposition, QUEUE_OUTCOMES)),
        "refusals": max((count for _, count in refusals), default=0.0),
        "refusal_p99_ms": 1000 * histogram_quantiles(refusals, (99,))["p99"],
        "protected": _protected(exposition),
    }


def _protected(exposition: str) -> dict[str, object] | None:
    """None from a gateway that did not count its protected requests' fate."""
    totals = counter_totals(exposition, PROTECTED_COUNTS)
    if len(totals) < len(PROTECTED_COUNTS):
        return None
    arrivals, refused = (totals[name] for name in PROTECTED_COUNTS)
    waits = histogram_buckets(exposition, PROTECTED_WAIT)
    return {
        "requests": arrivals,
        "refused_fraction": refused / arrivals if arrivals else math.nan,
        "refused_by_reason": counter_by_label(exposition, PROTECTED_COUNTS[1], "reason"),
        "queue_wait_p95_ms": 1000 * histogram_quantiles(waits, (95,))["p95"],
        "source": PROTECTED_SOURCE,
    }


def _queue_outcomes(totals: Mapping[str, float]) -> dict[str, object] | None:
    """None from a gateway that did not count its queue's dispatches apart."""
    if len(totals) < len(QUEUE_OUTCOMES):
        return None
    dispatched, expired, shed = (totals[name] for name in QUEUE_OUTCOMES)
    queued = dispatched + expired + shed
    return {
        "queued": queued,
        "unserved_fraction": (expired + shed) / queued if queued else math.nan,
        "source": QUEUE_SOURCE,
    }


def admitted_ttft_s(record: Record) -> float | None:
    """The successful attempt's own send to first token: what the gateway promised."""
    last = record.last
    if not record.ok or last.first_token_s is None:
        return None
    return last.first_token_s - last.start_s


def first_refusal(record: Record) -> str | None:
    """The code the gateway first turned the request away with; None if it never did."""
    return next((a.error for a in record.attempts if a.error in REFUSALS), None)


def recovery(
    records: Sequence[Record], promise_s: float, since_s: float, until_s: float
) -> dict[str, object]:
    """From `since_s` (a slowdown), to the end of the last 1 s window before `until_s` whose
    admitted TTFT p95 (windows by attempt start) broke the promise; 0 if none did."""
    windows: dict[int, list[float]] = defaultdict(list)
    for record in records:
        ttft = admitted_ttft_s(record)
        start = record.last.start_s
        if ttft is not None and since_s <= start < until_s:
            windows[int((start - since_s) // WINDOW_S)].append(ttft)
    count = max(1, math.ceil((until_s - since_s) / WINDOW_S))
    breached = [i for i, values in windows.items() if percentile(values, 95) > promise_s]
    after = (max(breached) + 1) * WINDOW_S if breached else 0.0
    return {
        "since_s": since_s,
        "recovery_s": after,
        "recovered": not breached or max(breached) < count - 1,
        "windows": count,
        "windows_breached": len(breached),
    }


def tenants(
    records: Sequence[Record],
    weights: Mapping[str, float],
    cost: Cost,
    capacity_work: float,
    duration_s: float,
    reach: Reach,
) -> dict[str, dict[str, object]]:
    """Each tenant's demand (the work its requests asked per second, served or not) against
    its max-min share of the capacity in the same unit, and what it got."""
    by_tenant: dict[str, list[Record]] = {tenant: [] for tenant in weights}
    for record in records:
        by_tenant[record.tenant].append(record)
    demands = {t: sum(map(cost, rs)) / duration_s for t, rs in by_tenant.items()}
    fair = shares.max_min_shares(demands, weights, capacity_work)
    found: dict[str, dict[str, object]] = {}
    for tenant, members in by_tenant.items():
        served = sum(cost(r) for r in members if r.ok) / duration_s
        found[tenant] = {
            "weight": weights[tenant],
            "demand": demands[tenant],
            "fair_share": fair[tenant],
            "above_share": demands[tenant] > fair[tenant],
            "served": served,
            "served_of_share": served / fair[tenant] if fair[tenant] > 0 else math.nan,
            **_group(members, reach),
            "failed_fraction": _fraction(sum(not r.ok for r in members), len(members)),
        }
    return found


@dataclass(frozen=True, slots=True)
class Basis:
    """What a variant's run is judged against."""

    lanes: Mapping[str, Slo]
    weights: Mapping[str, float]
    cost: Cost
    capacity: Mapping[str, float]
    """`rps` and `work` per second, over the run (`run._effective`)."""
    batch: int
    """Sequences the backend runs at once: what tenants share at a request's send."""
    duration_s: float
    promise_s: float
    slowdown_at_s: float | None
    step_s: float
    """The engine's shortest step: no sequence gets a token sooner (`shares.beyond_reach`)."""


def figures(
    records: Sequence[Record], basis: Basis, exposition: str | None = None
) -> dict[str, object]:
    """The variant's figures for one run; `exposition` is the gateway's /metrics after
    the run, None for a pass-through."""
    lanes, cost, capacity, duration_s = basis.lanes, basis.cost, basis.capacity, basis.duration_s
    goodput = goodput_rps(records, lanes, duration_s)
    good_work = sum(cost(r) for r in records if meets(r, lanes[r.lane])) / duration_s
    ttfts = [t for r in records if (t := admitted_ttft_s(r)) is not None]
    at_once = [
        a.end_s - a.start_s
        for r in records
        for a in r.attempts
        if a.error in REFUSALS and a.error not in WAITED
    ]
    ttft_p95 = percentile(ttfts, 95)
    gateway = None if exposition is None else gateway_figures(exposition)
    return {
        "requests": len(records),
        "goodput_rps": goodput,
        "goodput_rps_of_capacity": _ratio(goodput, capacity["rps"]),
        "goodput_work": good_work,
        "goodput_of_capacity": _ratio(good_work, capacity["work"]),
        "admitted": len(ttfts),
        "admitted_ttft_p95_s": ttft_p95,
        "admitted_ttft_p95_of_promise": ttft_p95 / basis.promise_s,
        "refusals_at_once": len(at_once),
        "refusals_after_waiting": sum(
            a.error in WAITED for r in records for a in r.attempts if a.error is not None
        ),
        "refusal_p99_ms": 1000 * percentile(at_once, 99),
        "refusal_source": REFUSAL_SOURCE,
        **share_figures(records, basis),
        "predictor": None if gateway is None else gateway["predictor"],
        "gateway_queue": None if gateway is None else gateway["queue"],
        "gateway_refusals": None if gateway is None else gateway["refusals"],
        "gateway_refusal_p99_ms": math.nan if gateway is None else gateway["refusal_p99_ms"],
        "gateway_protected": None if gateway is None else gateway["protected"],
        "recovery": None
        if basis.slowdown_at_s is None
        else recovery(records, basis.promise_s, basis.slowdown_at_s, duration_s),
        "pauses": pauses(records, basis.promise_s),
    }


def pauses(records: Sequence[Record], promise_s: float) -> dict[str, object]:
    """How long the streamed answers that succeeded stood still between two tokens at the
    most: a slot handed over pauses an answer, and its lane's promise bounds that pause.
    The longest, and how many answers stood still past the promise (with their own
    prefill again, which the bound leaves out, and the engine's slowest steps)."""
    gaps = [
        a.longest_gap_s for r in records for a in r.attempts if a.ok and a.longest_gap_s is not None
    ]
    return {
        "answers": len(gaps),
        "longest_s": max(gaps, default=math.nan),
        "past_promise": sum(gap > promise_s for gap in gaps),
    }


def share_figures(records: Sequence[Record], basis: Basis) -> dict[str, object]:
    """Tenants against their fair share three ways: by demand over the whole run (the
    first definition, kept), each request at its send, and per window of the promise."""
    weights, duration_s = basis.weights, basis.duration_s
    reach = _reach(records, basis)
    per_tenant = tenants(records, weights, basis.cost, basis.capacity["work"], duration_s, reach)
    below = [f for f in per_tenant.values() if not f["above_share"] and f["requests"]]
    above = [f["served_of_share"] for f in per_tenant.values() if f["above_share"]]
    at_send = shares.within_share_at_send(records, weights, basis.batch)
    within = [r for r, inside in zip(records, at_send, strict=True) if inside]
    beyond = [r for r, inside in zip(records, at_send, strict=True) if not inside]
    windowed = shares.by_window(
        records, weights, basis.cost, basis.capacity["work"], basis.promise_s, duration_s
    )
    below_windowed = [r for r, up in zip(records, windowed.above, strict=True) if not up]
    below_beyond = [
        r
        for r, up, inside in zip(records, windowed.above, at_send, strict=True)
        if not up and not inside
    ]
    ratios = [windowed.served[t] / windowed.shares[t] for t in windowed.shares]
    return {
        "tenants": per_tenant,
        "at_or_below_share": {
            "tenants": len(below),
            "queue_wait_p95_ms_max": _max(f["queue_wait_p95_ms"] for f in below),
            "refused_fraction_max": _max(f["refused_fraction"] for f in below),
            "beyond_reach_fraction_max": _max(f["beyond_reach_fraction"] for f in below),
            "windowed": {
                **_group(below_windowed, reach),
                **_asked(below_windowed, basis),
                "beyond_share_at_send": _group(below_beyond, reach),
            },
        },
        "above_share": {
            "tenants": len(above),
            "jain_served_of_share": jain(above) if len(above) >= 2 else math.nan,
            "tenants_windowed": len(ratios),
            "jain_windowed": jain(ratios) if len(ratios) >= 2 else math.nan,
        },
        "within_share": {
            **_group(within, reach),
            **_asked(within, basis),
            "per_tenant": {t: _group([r for r in within if r.tenant == t], reach) for t in weights},
        },
        "beyond_share": {**_group(beyond, reach), **_asked(beyond, basis)},
    }


def _reach(records: Sequence[Record], basis: Basis) -> Reach:
    """Of a class of the run's requests, the fraction `shares.beyond_reach` finds, every
    answer holding its slot at least the run's fewest output tokens asked at a step
    each (the whole run's, not the class's: the cautious end; one that asked none, or
    did not say, puts everything in reach)."""
    shortest_s = basis.step_s * min((r.asked_output_tokens for r in records), default=0)

    def fraction(members: Sequence[Record]) -> float:
        sends = [shares.first_send_s(r) for r in members]
        late = shares.beyond_reach(sends, basis.batch, SHARE_WAIT_S, shortest_s)
        return _fraction(late, len(members))

    return fraction


def _group(records: Sequence[Record], reach: Reach) -> dict[str, object]:
    waits = [w for r in records if (w := r.queue_wait_s) is not None]
    held = [w for r in records if (w := r.gateway_wait_s) is not None]
    codes = _refusal_codes(records)
    return {
        "requests": len(records),
        "queue_wait_p95_ms": 1000 * percentile(waits, 95),
        "queue_wait_samples": len(waits),
        "gateway_wait_p95_ms": 1000 * percentile(held, 95),
        "refused_fraction": _fraction(sum(codes.values()), len(records)),
        "refusals_by_code": codes,
        "beyond_reach_fraction": reach(records),
    }


def _refusal_codes(records: Sequence[Record]) -> dict[str, int]:
    """How many of the records the gateway turned away first with each code: where a
    class's refusals come from (the predictor, the shedding, a queue's age limit); they
    sum to the refused records."""
    codes: dict[str, int] = defaultdict(int)
    for record in records:
        first = first_refusal(record)
        if first is not None:
            codes[first] += 1
    return dict(sorted(codes.items()))


def _asked(records: Sequence[Record], basis: Basis) -> dict[str, float]:
    """The work the records asked per second over the capacity's: a class of requests that
    asks more than the capacity cannot all be served at once under any scheduler."""
    work = sum(map(basis.cost, records)) / basis.duration_s
    return {"asked_of_capacity": _ratio(work, basis.capacity["work"])}


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else math.nan


def _fraction(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


def _max(values: Iterable[object]) -> float:
    found = [v for v in values if isinstance(v, float) and not math.isnan(v)]
    return max(found) if found else math.nan
