"""One admitted request as policy code sees it: no HTTP in it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluicegate.core.types import Endpoint, Lane, Model, RoutePolicy, Tenant


@dataclass(slots=True)
class Call:
    """Who asks for what, the caller's deadline, and the token accounting of its attempt.

    `arrived_s` is when the caller's clock started (the request arrived), so every wait
    counts against `deadline_s`. `used_tokens` stays None until a provider reports usage.
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
    used_tokens: int | None = None
    dispatched_s: float | None = None
    first_byte_s: float | None = None
    excluded: set[str] = field(default_factory=set)
    """Deployments that already failed this request: tried last, if at all."""
    client_retries: int = 0
    """How many times the caller says it already sent this request (its SDK's header)."""
