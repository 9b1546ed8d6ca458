"""One upstream attempt of a request: what it was granted, what it sent, how it ended.

A request may make several attempts (retries, fallback, a hedge), each on its own
deployment. Each attempt owns its own grant (deployment, lane, pool permits), body,
timings and usage, so two attempts of one request can never write over each other,
and its outcome is decided once, from how it ended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluicegate.capacity.breaker import Breaker
from sluicegate.capacity.gates import BackendGate
from sluicegate.capacity.pools import Pool, PoolGroup, PoolPermit
from sluicegate.core.call import Call
from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Deployment, Lane

if TYPE_CHECKING:
    from sluicegate.scheduling.placement import Placed


@dataclass(slots=True)
class Target:
    """A deployment as the dispatcher sees it: its pools, backend gate and breaker."""

    deployment: Deployment
    pools: tuple[Pool, ...]
    gate: BackendGate
    breaker: Breaker
    group: PoolGroup = field(init=False)
    full: int = field(init=False)
    """The most attempts its pools allow at once."""

    def __post_init__(self) -> None:
        self.group = PoolGroup(self.pools)
        self.full = min(pool.limits.max_concurrency for pool in self.pools)


class Outcome(enum.StrEnum):
    """How an attempt ended."""

    OK = "ok"
    FAILED = "failed"
    """The deployment's fault: connection, timeout, 5xx, throttling, a broken stream."""
    REJECTED = "rejected"
    """The caller's own doing: a 4xx the deployment answered, or a deadline too short for
    the non-streamed answer it asked for (see `patience_s`)."""
    ABANDONED = "abandoned"
    """Nobody waits for it any more: cancelled, a lost hedge, the client gone. Only `ok`
    and `failed` are evidence of the deployment's health and speed."""


def patience_s(call: Call, wait_s: float, output_token_s: float) -> float:
    """How long an attempt may go without its first bytes: `wait_s` for a stream (its
    first token follows the prefill); a non-streamed answer's first bytes come with its
    whole body, so its wait also grows by `output_token_s` per output token asked for."""
    if call.stream:
        return wait_s
    return wait_s + (call.reserved_tokens - call.prompt_tokens) * output_token_s


def outcome_of(error: BaseException | None) -> Outcome:
    """Errors from upstream reach the pipeline classified (`GatewayError`); anything else
    (cancellation, the caller gone, a failure of the gateway's own) is no evidence
    against the deployment."""
    if error is None:
        return Outcome.OK
    if isinstance(error, GatewayError):
        return Outcome.FAILED if error.failover else Outcome.REJECTED
    return Outcome.ABANDONED


@dataclass(slots=True, eq=False)
class Attempt:
    """`avoid` names the deployments that already failed this request (tried last)."""

    call: Call
    number: int = 1
    lane: Lane = field(init=False)
    avoid: frozenset[str] = frozenset()
    hedge: bool = False
    """The second of a hedged pair: the same request again, not a new arrival."""
    target: Target | None = None
    placed: Placed | None = None
    """Where its model's strategy sent it first, and why (written by `Routing`)."""
    permit: PoolPermit | None = None
    body: dict[str, Any] | None = None
    dispatched_s: float | None = None
    first_byte_s: float | None = None
    used_tokens: int | None = None
    """Prompt + completion, as the provider reported them; None when it did not."""
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """Prompt tokens the provider read from its prefix cache, when it said."""
    relayed: int = 0
    """Stream events handed on, counted only for a priced request: its output when the
    stream is cut before the provider's usage arrives."""
    outcome: Outcome | None = None

    @property
    def first_byte_after_s(self) -> float | None:
        """Dispatch to first byte: the deployment's own latency for this attempt."""
        if self.first_byte_s is None or self.dispatched_s is None:
            return None
        return self.first_byte_s - self.dispatched_s

    def __post_init__(self) -> None:
        self.lane = self.call.lane

    def produced(self) -> int | None:
        """Output tokens, as the provider reported them; None when it did not."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        if self.used_tokens is None:
            return None
        return max(0, self.used_tokens - self.call.prompt_tokens)

    def end(self, error: BaseException | None) -> None:
        """Decide the outcome from how the attempt ended; the first decision stands."""
        if self.outcome is None:
            self.outcome = outcome_of(error)
