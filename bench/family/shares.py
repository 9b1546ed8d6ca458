"""Max-min fair shares by weight, and whether a tenant asked for more than its share at the
time: at each request's send, and per window of the promise's length.

Fair share is among the tenants active at the time. A tenant's average over a whole run
says nothing about its bursts: a burst larger than the free batch waits under any
scheduler, even an ideal fluid one, so only the requests of a burst beyond the tenant's
share at that moment can be asked to wait.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sluicegate.bench.records import Record

TOLERANCE = 1e-9
"""Water-filling in floats can leave a share a hair above a whole number of requests."""


def max_min_shares(
    demands: Mapping[str, float], weights: Mapping[str, float], capacity: float
) -> dict[str, float]:
    """Max-min fair shares by weight (water-filling): a tenant asking less than its weighted
    part gets what it asks, and what it leaves is split among the rest by weight. Tenants
    are taken in the order of `demands`, never a set's: the same floats in the same order
    give the same shares in every process (a rescore reproduces a run to the last bit)."""
    shares = dict.fromkeys(demands, 0.0)
    left = capacity
    open_ = [tenant for tenant, demand in demands.items() if demand > 0]
    while open_ and left > 0:
        total_weight = sum(weights[tenant] for tenant in open_)
        per_weight = left / total_weight
        sated = [t for t in open_ if demands[t] - shares[t] <= per_weight * weights[t]]
        if not sated:
            for tenant in open_:
                shares[tenant] += per_weight * weights[tenant]
            return shares
        for tenant in sated:
            left -= demands[tenant] - shares[tenant]
            shares[tenant] = demands[tenant]
        open_ = [tenant for tenant in open_ if tenant not in sated]
    return shares


def first_send_s(record: Record) -> float:
    return record.attempts[0].start_s


def within_share_at_send(
    records: Sequence[Record], weights: Mapping[str, float], batch: int
) -> list[bool]:
    """Per record, in order: whether its tenant had fewer requests outstanding before it
    than its max-min share of the backend's batch, the demands being every tenant's
    requests outstanding at its first send (its own included). Outstanding: first sent at
    or before, not ended yet. A tenant with nothing outstanding is always within."""
    outstanding = dict.fromkeys(weights, 0)
    ends: list[tuple[float, str]] = []
    within = [False] * len(records)
    for index in sorted(range(len(records)), key=lambda i: first_send_s(records[i])):
        record = records[index]
        while ends and ends[0][0] <= first_send_s(record):
            outstanding[heapq.heappop(ends)[1]] -= 1
        before = outstanding[record.tenant]
        outstanding[record.tenant] += 1
        heapq.heappush(ends, (record.end_s, record.tenant))
        share = max_min_shares(outstanding, weights, batch)[record.tenant]
        within[index] = before < share - TOLERANCE
    return within


def beyond_reach(sends: Sequence[float], batch: int, wait_s: float, shortest_s: float) -> int:
    """How many of the requests first sent at `sends` (a class of them, in seconds) no
    scheduler could start within `wait_s` of their send, unless it paused or cut an
    answer it had started: a lower bound on those that wait longer or are refused, for
    these send times (a closed loop's would move with its answers).

    A backend of `batch` sequences whose every answer holds its slot at least
    `shortest_s` starts at most `batch` sequences in any span of that length: a slot
    frees only when a sequence that was running as the span began ends. The requests
    sent in `[t, t + shortest_s - wait_s)` that start in time start in `[t, t +
    shortest_s)`, so beyond `batch` of them wait longer. Each group of such requests
    bounds its own; the groups share no request, so their sums add up."""
    reach_s = shortest_s - wait_s
    if reach_s <= 0:
        return 0
    ordered = sorted(sends)
    late, first = 0, 0
    while first < len(ordered):
        after = bisect.bisect_left(ordered, ordered[first] + reach_s, lo=first)
        late += max(0, after - first - batch)
        first = after
    return late


@dataclass(frozen=True, slots=True)
class Windowed:
    above: list[bool]
    """Per record: its tenant asked more than its share in the window of its first send."""
    served: dict[str, float]
    """Per tenant above its share in some window: work served over those windows."""
    shares: dict[str, float]
    """The same tenants: their shares summed over those windows."""


def by_window(
    records: Sequence[Record],
    weights: Mapping[str, float],
    cost: Callable[[Record], float],
    capacity_work: float,
    window_s: float,
    duration_s: float,
) -> Windowed:
    """Demand (the work of a tenant's requests first sent in a window) against max-min
    shares of the capacity's work in that window; the last window ends with the run.
    Served work is counted where it was done: a request's work spread evenly over its
    answering attempt, from its send to its end (a long answer's work, counted whole
    in the window it was sent, would be served many times that window's share)."""
    count = max(1, math.ceil(duration_s / window_s))
    at = [min(count - 1, max(0, int(first_send_s(r) // window_s))) for r in records]
    demand = [dict.fromkeys(weights, 0.0) for _ in range(count)]
    served = [dict.fromkeys(weights, 0.0) for _ in range(count)]
    for window, record in zip(at, records, strict=True):
        demand[window][record.tenant] += cost(record)
        if record.ok:
            for done_in, part in _spread(record.last.start_s, record.end_s, window_s, count):
                served[done_in][record.tenant] += cost(record) * part
    above: list[list[str]] = []
    served_above: dict[str, float] = {}
    share_above: dict[str, float] = {}
    for window in range(count):
        length = min(window_s, duration_s - window * window_s)
        shares = max_min_shares(demand[window], weights, capacity_work * length)
        above.append([t for t in weights if demand[window][t] > shares[t]])
        for tenant in above[-1]:
            served_above[tenant] = served_above.get(tenant, 0.0) + served[window][tenant]
            share_above[tenant] = share_above.get(tenant, 0.0) + shares[tenant]
    flags = [r.tenant in above[window] for window, r in zip(at, records, strict=True)]
    return Windowed(flags, served_above, share_above)


def _spread(start_s: float, end_s: float, window_s: float, count: int) -> list[tuple[int, float]]:
    """The windows [start, end) overlaps, each with its part of the span; a part past the
    last window is left out (done after the run), an instant span is one window's."""
    first = min(count - 1, max(0, int(start_s // window_s)))
    if end_s <= start_s:
        return [(first, 1.0)]
    span, parts = end_s - start_s, []
    for window in range(first, count):
        low, high = max(start_s, window * window_s), min(end_s, (window + 1) * window_s)
        if high <= low:
            break
        parts.append((window, (high - low) / span))
    return parts
