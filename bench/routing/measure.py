"""What a phase's records and scrapes come to: the figures issue 47's targets are read on."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sluicegate.bench.stats import backlogged_fairness, percentile

FAIRNESS_BIN_S = 2.0


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the client saw it; times in seconds from the phase's start."""

    tenant: str
    kind: str
    """`turn` or `one_shot`."""
    sent_s: float
    first_s: float | None
    end_s: float
    tokens: int
    error: str | None
    prompt_chars: int
    shared_chars: int


def ttft(records: Sequence[Sent], q: float) -> float:
    return percentile(
        [r.first_s - r.sent_s for r in records if r.first_s is not None and r.error is None], q
    )


def tokens_per_s(records: Sequence[Sent]) -> float:
    """Output tokens served over the span from the first send to the last answer."""
    done = [r for r in records if r.error is None]
    if not done:
        return math.nan
    span = max(r.end_s for r in done) - min(r.sent_s for r in records)
    return sum(r.tokens for r in done) / span if span > 0 else math.nan


def ceiling(records: Sequence[Sent]) -> float:
    """The share of prompt text that its conversation or application had sent before."""
    total = sum(r.prompt_chars for r in records)
    return sum(r.shared_chars for r in records) / total if total else math.nan


def max_over_mean(counts: Sequence[float]) -> float:
    mean = sum(counts) / len(counts) if counts else 0.0
    return max(counts) / mean if mean > 0 else math.nan


def above_share(waiting: Mapping[str, Sequence[float]], target: int) -> dict[str, float]:
    """Per backend, the share of its scrapes whose waiting queue was above `target`."""
    return {
        name: sum(1 for value in values if value > target) / len(values) if values else math.nan
        for name, values in waiting.items()
    }


def weighted_jain(records: Sequence[Sent], weights: Mapping[str, float], span_s: float) -> float:
    """Jain's index of served tokens over weight among the tenants that asked all through
    a bin (a request of theirs in progress from its start to its end), averaged over the
    bins where two or more did: at this load a tenant seldom waits for a first token all
    through a bin, so the harness's stricter "waiting" would leave most runs without one."""
    waiting: dict[str, list[tuple[float, float]]] = defaultdict(list)
    served: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in records:
        started = r.end_s if r.first_s is None else r.first_s
        waiting[r.tenant].append((r.sent_s, r.end_s))
        if r.error is None:
            served[r.tenant].append((started, r.end_s, r.tokens / weights[r.tenant]))
    for tenant in weights:
        waiting.setdefault(tenant, [])
    return backlogged_fairness(waiting, served, span_s, FAIRNESS_BIN_S).index
