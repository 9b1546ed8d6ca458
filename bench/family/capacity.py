"""Capacity of a variant: the highest Poisson rate the backend alone serves inside the SLO.

A bisection in log space over [ceiling / 8, 1.5 x ceiling], where the ceiling is computed
from the simulator's timing (the rate at which a full batch would be busy all the time,
which no steady state can beat; the top lies above it because a short probe can pass
there before a queue builds). Each step is one short probe against the simulator alone,
and a rate passes when at least 99 % of its requests succeeded inside the SLO; the
capacity is the best passing rate, but never above the ceiling. `steps`
probes narrow the bracket to a factor 12^(1/2^steps) (5 steps: within 8 %), so the cost
is `steps` x probe length (plus the probes' drains), bounded whatever the variant.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sluicegate.bench.records import Record
from sluicegate.sim.engine import EngineSettings

IN_SLO = 0.99
BRACKET = 8.0
ABOVE = 1.5
EXTRA_STEPS = 2
"""Halvings below the bracket when no probe in it passed, before giving up."""


@dataclass(frozen=True, slots=True)
class Probe:
    rate_rps: float
    requests: int
    in_slo: float
    """Fraction of the probe's requests that succeeded inside the SLO."""
    cost_s: float
    """Mean `request_cost_s` of the requests the probe sent."""
    service_s: float
    """Mean first send to end of the requests that succeeded."""

    @property
    def passed(self) -> bool:
        return self.requests > 0 and self.in_slo >= IN_SLO


@dataclass(frozen=True, slots=True)
class Capacity:
    ceiling_rps: float
    probes: tuple[Probe, ...]

    @property
    def best(self) -> Probe | None:
        passed = [probe for probe in self.probes if probe.passed]
        return max(passed, key=lambda probe: probe.rate_rps) if passed else None

    @property
    def rate_rps(self) -> float:
        """The best passing rate, held to the ceiling: a short probe can pass above it
        before a queue builds, but no steady state can (the family's second baseline
        run found 1.39x the ceiling). NaN when no probe passed: the variant has no
        capacity to compare with."""
        best = self.best
        return math.nan if best is None else min(best.rate_rps, self.ceiling_rps)


Measure = Callable[[float], Awaitable[Probe]]


def request_cost_s(settings: EngineSettings, prompt_tokens: float, output_tokens: float) -> float:
    """Seconds of the backend one request takes when its batch is full: its prefill, and
    its share of the full-batch steps that decode it. The unit of work that goodput and
    fair shares are counted in, so a mix of long and short requests weighs what it costs."""
    batch = settings.max_num_seqs
    full_step_s = settings.step_base_s + settings.step_per_seq_s * batch
    per_request_s = (
        output_tokens * full_step_s / batch + settings.prefill_s_per_token * prompt_tokens
    )
    return per_request_s * settings.time_scale


def work(settings: EngineSettings) -> Callable[[Record], float]:
    """A request's `request_cost_s` from the tokens it asked for, served or not."""

    def cost(record: Record) -> float:
        return request_cost_s(settings, record.asked_prompt_tokens, record.asked_output_tokens)

    return cost


def ceiling_rps(
    settings: EngineSettings, prompt_tokens: float, output_tokens: float, slowdown: float
) -> float:
    """Requests/s at which a full batch decodes without pause: no SLO can beat it."""
    return 1.0 / (request_cost_s(settings, prompt_tokens, output_tokens) * slowdown)


async def search(measure: Measure, ceiling: float, steps: int) -> Capacity:
    """Bisect log(rate) in [ceiling / BRACKET, ceiling x ABOVE]; below it, halve while
    nothing passed."""
    low, high = math.log(ceiling / BRACKET), math.log(ceiling * ABOVE)
    probes: list[Probe] = []
    for _ in range(steps):
        middle = (low + high) / 2
        probe = await measure(math.exp(middle))
        probes.append(probe)
        if probe.passed:
            low = middle
        else:
            high = middle
    rate = math.exp(low)
    for _ in range(EXTRA_STEPS if not any(p.passed for p in probes) else 0):
        probe = await measure(rate)
        probes.append(probe)
        if probe.passed:
            break
        rate /= 2
    return Capacity(ceiling, tuple(probes))
