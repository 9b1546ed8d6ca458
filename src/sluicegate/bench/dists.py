"""Distributions of prompt and output lengths and of think times, drawn from a seeded RNG.

A plain number in a scenario means a fixed value, so simple scenarios stay short.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from sluicegate.config.schema import Strict

NonNegative = Annotated[float, Field(ge=0)]


class Fixed(Strict):
    dist: Literal["fixed"] = "fixed"
    value: NonNegative

    def sample(self, rng: random.Random) -> float:
        return self.value


class Uniform(Strict):
    dist: Literal["uniform"]
    low: NonNegative
    high: NonNegative

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError("high must be >= low")
        return self

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)


class Lognormal(Strict):
    """Long-tailed, as real prompt and answer lengths are; `max` cuts the tail."""

    dist: Literal["lognormal"]
    median: Annotated[float, Field(gt=0)]
    sigma: NonNegative
    max: Annotated[float, Field(gt=0)] | None = None

    def sample(self, rng: random.Random) -> float:
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        return value if self.max is None else min(value, self.max)


def _number_is_fixed(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


AnyDist = Fixed | Uniform | Lognormal
Dist = Annotated[AnyDist, Field(discriminator="dist"), BeforeValidator(_number_is_fixed)]


def count(dist: AnyDist, rng: random.Random) -> int:
    """A token count: at least one, since a request of no tokens is no request."""
    return max(1, round(dist.sample(rng)))
