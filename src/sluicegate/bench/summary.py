"""Records to the figures of a scenario run: load, outcomes, latency, fairness, time series.

Everything here is a pure function of the records, so the same run can be summarised
again later from its `requests.jsonl`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

from sluicegate.bench.records import Record
from sluicegate.bench.scenario import Slo
from sluicegate.bench.stats import backlogged_fairness, percentile
from sluicegate.core.refusals import Refusal

BIN_S = 1.0
QUANTILES = (50, 95, 99)
REFUSALS = frozenset(Refusal)
WAITED = frozenset({Refusal.EXPIRED, Refusal.DEADLINE, Refusal.SHED})
"""Refusals that may come after a wait in a lane's queue: their latency is that wait."""
DEFINITIONS = {
    "capacity": "the highest Poisson arrival rate that the simulator alone (default timing) "
    "serves with >= 99% of requests inside the scenario's SLOs",
    "offered": "distinct requests sent per second of the run (retries not included)",
    "attempts": "HTTP requests sent per second, retries included",
    "accepted": "distinct requests that succeeded (2xx, whole answer), per second",
    "goodput": "distinct requests that succeeded inside their lane's SLOs, per second; a "
    "request and its retries count once",
    "per second": "counts over the run's duration; requests sent in it are followed to their "
    "end, through the drain time",
    "TTFT": "first send of the request (retries and their waits included) to the first SSE "
    "event with output text; a non-streamed answer's first token comes with its body",
    "TPOT": "(last token - first token) / (output tokens - 1) of the successful attempt",
    "tokens/s": "prompt + output tokens of successful requests, over first send to last end "
    "(the work delivered; compare runs of one scenario for work conservation)",
    "end-to-end": "first send of the request to the end of its last attempt",
    "refusal latency": "send to end of an attempt refused by the gateway's own limits (its "
    "closed list of refusal codes), as the client saw it; 'at once' leaves out expired and "
    "deadline_exceeded, which may follow a wait in a queue",
    "fairness": "Jain's index of tokens served (prompt + output, spread over first token to "
    "end) per 1 s bin among the tenants backlogged all through the bin (a request waiting for "
    "its first token or for a retry), averaged over bins with two or more of them; only bins "
    "of the run's duration count (in the drain no new work arrives, so what is still queued "
    "says nothing about the tenants' demand)",
}


def meets(record: Record, slo: Slo) -> bool:
    """Succeeded, and inside every target its lane sets (TPOT only where it applies)."""
    if not record.ok:
        return False
    ttft, tpot = record.ttft_s, record.tpot_s
    return (
        (slo.ttft_s is None or (ttft is not None and ttft <= slo.ttft_s))
        and (slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s)
        and (slo.e2e_s is None or record.e2e_s <= slo.e2e_s)
    )


NEAR_SLO_S = 0.010
"""A client-side TTFT this close to its lane's SLO may fall on the other side of it on the
gateway's clock: the two clocks start and stop a loopback hop and an event loop apart."""

SLO_KEYS = {"ttft_s": "ttft_slo_s", "tpot_s": "tpot_slo_s", "e2e_s": "e2e_slo_s"}
"""A scenario lane's SLO and the gateway lane setting that must match it."""


def slo_accounting(
    records: Sequence[Record],
    lanes: Mapping[str, Slo],
    counted: Mapping[str, Mapping[str, float]] | None,
    gateway_lanes: Sequence[Mapping[str, object]],
) -> dict[str, dict[str, object]] | None:
    """Per lane, the requests that met its SLOs as the clients judged them and as the
    gateway counted them, and those whose client-side TTFT lay within `NEAR_SLO_S` of
    the SLO. `agrees` when the two counts differ by at most 2 % or by that many; None
    when they cannot be compared: a client retried (the gateway counts each try), or
    the gateway's lane does not carry the scenario's SLOs. None without the gateway's
    counts."""
    if counted is None:
        return None
    retried = any(len(r.attempts) > 1 for r in records)
    configured = {str(lane.get("name")): lane for lane in gateway_lanes}
    found: dict[str, dict[str, object]] = {}
    for name, slo in lanes.items():
        mine = [r for r in records if r.lane == name]
        client = sum(meets(r, slo) for r in mine)
        gateway = round(counted.get(name, {}).get("met", 0.0))
        ttft = slo.ttft_s
        near = sum(
            1
            for r in mine
            if ttft is not None and r.ttft_s is not None and abs(r.ttft_s - ttft) <= NEAR_SLO_S
        )
        lane = configured.get(name, {})
        same = all(lane.get(key) == getattr(slo, own) for own, key in SLO_KEYS.items())
        agrees = None if retried or not same else abs(gateway - client) <= max(0.02 * client, near)
        found[name] = {
            "client_met": client,
            "gateway_met": gateway,
            "near_slo": near,
            "agrees": agrees,
        }
    return found


def goodput_rps(records: Iterable[Record], lanes: Mapping[str, Slo], duration_s: float) -> float:
    return sum(meets(r, lanes[r.lane]) for r in records) / duration_s


def load(
    records: Sequence[Record],
    lanes: Mapping[str, Slo],
    duration_s: float,
    capacity_rps: float | None,
) -> dict[str, float | int | None]:
    goodput = goodput_rps(records, lanes, duration_s)
    attempts = sum(len(r.attempts) for r in records)
    first = min((r.start_s for r in records), default=0.0)
    busy_s = max((r.end_s for r in records), default=0.0) - first
    return {
        "duration_s": duration_s,
        "requests": len(records),
        "attempts": attempts,
        "offered_rps": len(records) / duration_s,
        "attempts_rps": attempts / duration_s,
        "accepted_rps": sum(r.ok for r in records) / duration_s,
        "goodput_rps": goodput,
        "capacity_rps": capacity_rps,
        "goodput_of_capacity": None if capacity_rps is None else goodput / capacity_rps,
        "tokens_per_s": sum(r.service_tokens for r in records) / busy_s if busy_s > 0 else 0.0,
    }


def statuses(records: Sequence[Record]) -> dict[str, dict[str, int]]:
    """Final outcome per request, and every attempt's, each as `STATUS kind`."""
    return {
        "requests": dict(Counter(r.last.outcome for r in records).most_common()),
        "attempts": dict(Counter(a.outcome for r in records for a in r.attempts).most_common()),
    }


def latency(records: Sequence[Record], lanes: Mapping[str, Slo]) -> dict[str, object]:
    return {
        "tenant": _grouped(records, lanes, lambda r: r.tenant),
        "lane": _grouped(records, lanes, lambda r: r.lane),
        "all": _group(records, lanes),
    }


def refusals(records: Sequence[Record]) -> dict[str, object]:
    """Refusal latency at once (the figure the issue sets a target for), and per code."""
    by_code: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for a in r.attempts:
            if a.error in REFUSALS:
                by_code[a.error].append(a.end_s - a.start_s)
    at_once = [t for code, took in by_code.items() if code not in WAITED for t in took]
    return {
        "at_once": _took(at_once),
        "by_code": {code: _took(took) for code, took in sorted(by_code.items())},
    }


def fairness(records: Sequence[Record], span_s: float) -> dict[str, object]:
    waiting: dict[str, list[tuple[float, float]]] = defaultdict(list)
    served: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in records:
        waiting[r.tenant].append((r.start_s, r.waiting_until_s))
        if r.ok:
            served[r.tenant].append((r.waiting_until_s, r.end_s, r.service_tokens))
    found = backlogged_fairness(waiting, served, span_s, BIN_S)
    return {
        "jain_index": found.index,
        "jain_all_backlogged": found.window_index,
        "service_all_backlogged": found.all_backlogged,
        "bins": found.bins,
        "bin_s": BIN_S,
        "backlogged_s": found.backlogged_s,
        "service_tokens": found.service,
    }


def series(records: Sequence[Record], lanes: Mapping[str, Slo], span_s: float) -> dict[str, object]:
    """Per-second counts (by send time, or by end time for outcomes) and TTFT p95 per lane."""
    count = math.ceil(span_s / BIN_S)

    def per_bin(times: Iterable[float]) -> list[int]:
        bins = [0] * count
        for t in times:
            bins[min(count - 1, int(t // BIN_S))] += 1
        return bins

    ttft: dict[str, list[list[float]]] = {lane: [[] for _ in range(count)] for lane in lanes}
    for r in records:
        if r.ttft_s is not None:
            ttft[r.lane][min(count - 1, int(r.start_s // BIN_S))].append(r.ttft_s)
    return {
        "bin_s": BIN_S,
        "t_s": [index * BIN_S for index in range(count)],
        "offered": per_bin(r.start_s for r in records),
        "attempts": per_bin(a.start_s for r in records for a in r.attempts),
        "accepted": per_bin(r.end_s for r in records if r.ok),
        "goodput": per_bin(r.end_s for r in records if meets(r, lanes[r.lane])),
        "ttft_p95_ms": {
            lane: [1000 * percentile(values, 95) for values in bins] for lane, bins in ttft.items()
        },
    }


def span_s(records: Sequence[Record], duration_s: float) -> float:
    """The run's duration, stretched to the end of its last request."""
    return max([duration_s, *(r.end_s for r in records)])


def _grouped(
    records: Sequence[Record], lanes: Mapping[str, Slo], key: Callable[[Record], str]
) -> dict[str, dict[str, object]]:
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[key(r)].append(r)
    return {name: _group(members, lanes) for name, members in sorted(groups.items())}


def _group(records: Sequence[Record], lanes: Mapping[str, Slo]) -> dict[str, object]:
    ttft = [t for r in records if (t := r.ttft_s) is not None]
    tpot = [t for r in records if (t := r.tpot_s) is not None]
    e2e = [r.e2e_s for r in records if r.ok]
    return {
        "requests": len(records),
        "ok": sum(r.ok for r in records),
        "in_slo": sum(meets(r, lanes[r.lane]) for r in records),
        "ttft_ms": _quantiles_ms(ttft),
        "tpot_ms": _quantiles_ms(tpot),
        "e2e_ms": _quantiles_ms(e2e),
    }


def _took(seconds: Sequence[float]) -> dict[str, float | int]:
    return {"count": len(seconds), **{f"{q}_ms": v for q, v in _quantiles_ms(seconds).items()}}


def _quantiles_ms(values: Sequence[float]) -> dict[str, float]:
    return {f"p{q}": 1000 * percentile(values, q) for q in QUANTILES}
