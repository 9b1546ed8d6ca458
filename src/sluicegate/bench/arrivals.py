"""When a flow's requests are sent: open loop (Poisson, bursts) or closed loop (callers).

Open-loop arrivals do not wait for answers, so an overloaded server keeps receiving
work; a closed loop slows down with the server. Both matter for overload behaviour.
"""

from __future__ import annotations

import random
from typing import Annotated, Literal

from pydantic import Field

from sluicegate.bench.dists import Dist, Fixed
from sluicegate.bench.loadgen import poisson_arrivals
from sluicegate.config.schema import Strict

MAX_BURST = 100_000
MAX_CLIENTS = 10_000


class Poisson(Strict):
    kind: Literal["poisson"]
    rate: Annotated[float, Field(gt=0, description="requests per second")]

    def offsets(self, span_s: float, rng: random.Random) -> list[float]:
        return poisson_arrivals(self.rate, span_s, rng)


class Burst(Strict):
    """`count` requests at once at each time in `at_s`, seconds after the flow's start."""

    kind: Literal["burst"]
    count: Annotated[int, Field(ge=1, le=MAX_BURST)]
    at_s: list[Annotated[float, Field(ge=0)]] = Field(default_factory=lambda: [0.0])

    def offsets(self, span_s: float, rng: random.Random) -> list[float]:
        return [at for at in sorted(self.at_s) if at < span_s for _ in range(self.count)]


class Closed(Strict):
    """`clients` callers, each sending again once its last request ended and it thought."""

    kind: Literal["closed"]
    clients: Annotated[int, Field(ge=1, le=MAX_CLIENTS)]
    think_s: Dist = Fixed(value=0)


OpenLoop = Poisson | Burst
Arrival = Annotated[Poisson | Burst | Closed, Field(discriminator="kind")]
