"""Percentiles and Jain's fairness index: pure functions over plain numbers and intervals."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Interval = tuple[float, float]
Served = tuple[float, float, float]
"""Service given from a start to an end time, in tokens: spread evenly across that span."""


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def jain(values: Sequence[float]) -> float:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one takes everything.

    NaN when nobody got anything, where equal shares of nothing say nothing.
    """
    squares = sum(x * x for x in values)
    return sum(values) ** 2 / (len(values) * squares) if squares > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Fairness:
    index: float
    """Mean over the bins with two or more backlogged tenants; NaN when there were none."""
    bins: int
    backlogged_s: dict[str, float]
    service: dict[str, float]
    all_backlogged: dict[str, float]
    """Service summed over the bins in which every tenant was backlogged: the shares a
    fair scheduler promises, without the noise of one request's tokens in one bin."""

    @property
    def window_index(self) -> float:
        return jain(list(self.all_backlogged.values())) if self.all_backlogged else math.nan


def backlogged_fairness(
    waiting: Mapping[str, Sequence[Interval]],
    served: Mapping[str, Sequence[Served]],
    span_s: float,
    bin_s: float,
) -> Fairness:
    """Jain's index of the service given, per bin, among the tenants backlogged all through it.

    A tenant is backlogged while one of its requests waits for service (sent, no first
    token yet, or waiting to retry): it wanted more than it got. Tenants that were
    served as fast as they asked are left out, so meeting a small demand is not unfair.
    """
    count = math.ceil(span_s / bin_s)
    merged = {tenant: _merge(spans) for tenant, spans in waiting.items()}
    per_bin = {tenant: _spread(items, count, bin_s) for tenant, items in served.items()}
    backlogged_s = dict.fromkeys(waiting, 0.0)
    together = dict.fromkeys(waiting, 0.0) if len(waiting) > 1 else {}
    indexes: list[float] = []
    for index in range(count):
        low, high = index * bin_s, min((index + 1) * bin_s, span_s)
        tenants = [tenant for tenant, spans in merged.items() if _covers(spans, low, high)]
        for tenant in tenants:
            backlogged_s[tenant] += high - low
        if len(tenants) < 2:
            continue
        given = [per_bin[tenant][index] if tenant in per_bin else 0.0 for tenant in tenants]
        if len(tenants) == len(waiting):
            for tenant, amount in zip(tenants, given, strict=True):
                together[tenant] += amount
        value = jain(given)
        if not math.isnan(value):
            indexes.append(value)
    service = {tenant: sum(items) for tenant, items in per_bin.items()}
    mean = sum(indexes) / len(indexes) if indexes else math.nan
    together = together if any(together.values()) else {}
    return Fairness(mean, len(indexes), backlogged_s, service, together)


def _merge(spans: Sequence[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covers(merged: Sequence[Interval], low: float, high: float) -> bool:
    """Disjoint, sorted intervals: only the last one starting by `low` can cover the bin."""
    at = bisect.bisect_right(merged, (low, math.inf)) - 1
    return at >= 0 and merged[at][1] >= high


def _spread(items: Sequence[Served], count: int, bin_s: float) -> list[float]:
    """Each item's tokens shared among the bins it overlaps; what falls outside is dropped."""
    bins = [0.0] * count
    for start, end, tokens in items:
        if end <= start:
            at = int(end // bin_s)
            if 0 <= at < count:
                bins[at] += tokens
            continue
        rate = tokens / (end - start)
        for at in range(max(0, int(start // bin_s)), min(count, int(end // bin_s) + 1)):
            overlap = min(end, (at + 1) * bin_s) - max(start, at * bin_s)
            bins[at] += rate * max(0.0, overlap)
    return bins
