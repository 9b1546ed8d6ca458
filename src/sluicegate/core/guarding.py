"""The runtime snapshot of the `guardrails:` section: which checks exist and where they apply.

A guardrail is a dependency like a provider: it has a time budget and a stated failure
mode. Blocking and masking fail closed unless told otherwise (a check that protects
must not silently stop protecting); audit-only checks fail open (they protect nothing).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Action(enum.StrEnum):
    """What a flagged text does to the request."""

    BLOCK = "block"
    MASK = "mask"
    AUDIT = "audit"


class Placement(enum.StrEnum):
    """When a guardrail runs: before the model, beside it, or on its answer."""

    PRE_CALL = "pre_call"
    PARALLEL = "parallel"
    POST_CALL = "post_call"


class OnFailure(enum.StrEnum):
    """What a guardrail whose check cannot answer in time (or at all) does."""

    OPEN = "fail_open"
    CLOSED = "fail_closed"


def default_failure(action: Action) -> OnFailure:
    """Audit protects nothing, so it fails open; block and mask fail closed."""
    return OnFailure.OPEN if action is Action.AUDIT else OnFailure.CLOSED


@dataclass(frozen=True, slots=True)
class CheckerSpec:
    """How to build one checker: its `kind` and that kind's settings."""

    kind: str
    settings: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """May hold credentials (an HTTP checker's headers): kept out of reprs."""
    budget_s: float = 0.5


@dataclass(frozen=True, slots=True)
class GuardrailSpec:
    """One named guardrail. `window` is the most characters a stream is held back by
    its post-call check; `cache_ttl_s` 0 keeps no decisions."""

    name: str
    checker: CheckerSpec
    action: Action
    placement: Placement
    on_failure: OnFailure
    fallback: CheckerSpec | None = None
    window: int = 256
    cache_ttl_s: float = 60.0
    cache_size: int = 10_000


@dataclass(frozen=True, slots=True)
class GuardrailRule:
    """Guardrails applied to requests matching every filter given (None: any)."""

    guardrails: tuple[str, ...]
    routes: frozenset[str] | None = None
    lanes: frozenset[str] | None = None
    tenants: frozenset[str] | None = None
    cut_streams: bool = False
    """A streamed answer need not wait for its parallel checks before its first token:
    it is cut, with an error event, if one of them fails."""

    def matches(self, route: str, lane: str, tenant: str) -> bool:
        return (
            (self.routes is None or route in self.routes)
            and (self.lanes is None or lane in self.lanes)
            and (self.tenants is None or tenant in self.tenants)
        )


@dataclass(frozen=True, slots=True)
class GuardrailPolicy:
    """Every guardrail and the rules that apply them; `version` changes whenever the
    section does, so cached decisions never outlive the config that made them."""

    guardrails: Mapping[str, GuardrailSpec] = field(default_factory=dict)
    rules: tuple[GuardrailRule, ...] = ()
    version: str = ""

    def select(self, route: str, lane: str, tenant: str) -> Selection:
        """The guardrails for one request by placement, each in the configured order
        and once."""
        chosen: dict[str, GuardrailSpec] = {}
        cut = False
        for rule in self.rules:
            if rule.matches(route, lane, tenant):
                cut = cut or rule.cut_streams
                for name in rule.guardrails:
                    chosen.setdefault(name, self.guardrails[name])
        specs = chosen.values()
        return Selection(
            tuple(s for s in specs if s.placement is Placement.PRE_CALL),
            tuple(s for s in specs if s.placement is Placement.PARALLEL),
            tuple(s for s in specs if s.placement is Placement.POST_CALL),
            cut,
        )


@dataclass(frozen=True, slots=True)
class Selection:
    pre_call: tuple[GuardrailSpec, ...] = ()
    parallel: tuple[GuardrailSpec, ...] = ()
    post_call: tuple[GuardrailSpec, ...] = ()
    cut_streams: bool = False

    @property
    def any(self) -> bool:
        return bool(self.pre_call or self.parallel or self.post_call)
