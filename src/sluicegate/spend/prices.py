"""What an attempt costs at its deployment's prices, in whole nanodollars.

Money is counted in integers (billionths of a dollar) so that a shared store adds it
exactly and atomically; one nanodollar per token is a price of $1,000 per million
tokens, far finer than any price. An attempt's cost is rounded up: the gateway never
counts less than the provider bills.

Usage comes from a peer that may lie: every count is clamped to [0, MAX_TOKENS], and
cached prompt tokens to the prompt.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from sluicegate.core.types import Model, Price

NANOS = 1_000_000_000
"""Nanodollars in a dollar."""
MAX_TOKENS = 10_000_000
"""More tokens than any one answer has: a usage count beyond it is a lie, clamped."""


class Usage(NamedTuple):
    """What one attempt used: prompt tokens (of which `cached` from the prefix cache) and
    output tokens; `estimated` when the provider reported none (a cancelled stream,
    counted as its prompt and the tokens relayed)."""

    prompt: int
    cached: int
    output: int
    estimated: bool = False


def clamped(prompt: int, cached: int, output: int, estimated: bool = False) -> Usage:
    prompt = min(max(prompt, 0), MAX_TOKENS)
    return Usage(prompt, min(max(cached, 0), prompt), min(max(output, 0), MAX_TOKENS), estimated)


def cost_nanos(price: Price, usage: Usage, discounted: bool) -> int:
    """`usage` at `price` (per million tokens: a token costs price x 1000 nanodollars),
    less the batch discount for jobs (`discounted`)."""
    fresh = usage.prompt - usage.cached
    nanos = (
        fresh * price.input + usage.cached * price.cached_input + usage.output * price.output
    ) * 1000
    if discounted:
        nanos *= 1 - price.batch_discount
    return math.ceil(nanos)


def most_per_token(model: Model) -> tuple[float, float]:
    """The highest input and output prices among `model`'s deployments (per million
    tokens): what a reservation is priced at, since any of them may serve an attempt."""
    prices = [d.price for d in model.deployments if d.price is not None]
    if not prices:
        return 0.0, 0.0
    return max(p.input for p in prices), max(p.output for p in prices)


def cost_per_success(nanos: int, successes: int) -> float | None:
    """Dollars per successful request, from their total cost; None before any."""
    return round(nanos / successes / NANOS, 9) if successes else None


def estimate_nanos(rates: tuple[float, float], prompt: int, output: int) -> int:
    """A reservation: `prompt` and `output` tokens at `rates` (input, output)."""
    return math.ceil((prompt * rates[0] + output * rates[1]) * 1000)
