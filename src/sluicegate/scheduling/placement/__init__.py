"""Where does an attempt go? A model's deployments, in the order to try them.

A strategy answers that one question per model (`models[].strategy`), after the
dispatcher has decided who goes now (lanes, fair shares): it never reorders tenants,
only chooses among deployments. It names why its first choice came first (`Placed`);
the dispatcher tries the candidates in order, so fallback on failure, breakers,
cooldowns, pools and the backend gate hold under every strategy. A strategy that
learns from where attempts went hears `placed` once one has gone.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sluicegate.scheduling.attempt import Attempt, Target


class Reason(enum.StrEnum):
    ORDER = "order"
    """The configured order, or its rotation."""
    LEAST_LOADED = "least_loaded"
    AFFINITY = "affinity"
    """The deployment that holds the longest part of the prompt already."""
    HASH = "hash"
    """A prompt nobody sent lately: the deployment its first block hashes to, the same
    on every gateway replica."""
    OVERRIDE = "load_override"
    """The affine deployment was loaded too far beyond the others."""
    FALLBACK = "fallback"
    """The first choice refused or failed: a later candidate took the attempt."""


@dataclass(frozen=True, slots=True)
class Placed:
    """A strategy's verdict on one attempt: its first choice, why, and what the strategy
    keeps to learn from where it went."""

    first: str
    reason: Reason
    key: Any = None


class Placement(Protocol):
    name: str

    def order(self, targets: Sequence[Target], attempt: Attempt) -> tuple[list[Target], Placed]:
        """Every one of `targets`, in the order to try them."""
        ...

    def placed(self, attempt: Attempt, target: Target, placed: Placed) -> None:
        """`attempt`, ordered as `placed`, went to `target`."""
        ...

    def view(self) -> dict[str, Any]: ...


def load_of(target: Target) -> float:
    """How full a deployment is, per batch slot: its backend's requests running and
    waiting (as last scraped, plus this gateway's sends since) over its batch, or its
    KV cache in use where that is fuller; without metrics, this gateway's own attempts
    in flight there over its pools' limit. A slower or smaller replica fills up at a
    lower rate of sends, so its metrics steer work away from it without hand-set
    weights. The batch is the configured one or else the most the backend was seen
    running, never the pools' limit: over a limit far wider than the batch, the sends
    since the scrape would weigh next to nothing beside the scraped KV cache, and every
    send until the next scrape would go to the backend that was emptiest at the last."""
    load = target.gate.load()
    if load is None:
        return target.breaker.in_flight / target.full
    per_slot = load.requests / (load.batch or target.full)
    return per_slot if load.kv_usage is None else max(per_slot, load.kv_usage)


def slot_of(target: Target) -> float:
    """How much one request adds to `load_of(target)`: one slot of the batch that load
    is counted in. Loads move in these steps, so a bound on load means something only
    when it is wider than one of them."""
    load = target.gate.load()
    if load is None:
        return 1 / target.full
    return 1 / (load.batch or target.full)
