"""One admitted request as policy code sees it: no HTTP in it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from sluicegate.core.types import Endpoint, Lane, Model, RoutePolicy, Tenant


class Call(NamedTuple):
    """Who asks for what, the caller's deadline and the request's estimates; fixed once
    resolved (a tuple: one is built per request on the hot path). What happens to each
    upstream attempt belongs to that attempt.

    `arrived_s` is when the caller's clock started (the request arrived), so every wait
    counts against `deadline_s`. `payload` is the caller's body as admitted (rewritten
    only by the lane's caps and the degradation ladder, before this was built); each
    attempt sends its own copy, built for its deployment.
    """

    endpoint: Endpoint
    tenant: Tenant
    model: Model
    route: RoutePolicy
    lane: Lane
    payload: dict[str, Any]
    stream: bool
    arrived_s: float
    deadline_s: float
    prompt_tokens: int
    reserved_tokens: int
    client_retries: int = 0
    """How many times the caller says it already sent this request (its SDK's header)."""
    resumed: bool = False
    """The rest of an answer whose stream gave its slot away (`handover.Giver`): its
    caller has its first tokens, so it waits for a slot ahead of other work, bounded by
    its deadline alone, and is judged by no promise."""
    bill: Bill | None = None
    """What its attempts cost, shared by all its parts; None when nothing is priced."""


class Bill:
    """One request's spend over all its attempts (nanodollars), which its budgets
    settle against; `discounted` for jobs and batches, `estimated` once an attempt's
    usage had to be estimated. `late`, once its budgets are settled, counts there the
    cost of an attempt that ends after (a lost hedge let go in the background)."""

    __slots__ = ("discounted", "estimated", "late", "nanos")

    def __init__(self, discounted: bool = False) -> None:
        self.discounted = discounted
        self.nanos = 0
        self.estimated = False
        self.late: Callable[[int], None] | None = None


class Tally:
    """The tokens a request's answer really used, as its provider reported them: what the
    request's own quotas are settled against once it has ended. None while unknown."""

    __slots__ = ("used_tokens",)

    def __init__(self) -> None:
        self.used_tokens: int | None = None
