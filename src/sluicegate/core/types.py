"""The runtime snapshot of the configuration: plain frozen values, parsed once at start."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sluicegate.core.limits import Rate


class Endpoint(enum.Enum):
    """The inference routes; the value is the metric label."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"

    @property
    def path(self) -> str:
        return _PATHS[self]

    @property
    def streams(self) -> bool:
        return self is not Endpoint.EMBEDDINGS


_PATHS = {
    Endpoint.CHAT: "/v1/chat/completions",
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.EMBEDDINGS: "/v1/embeddings",
}


@dataclass(frozen=True, slots=True)
class Timeouts:
    """`read_s` bounds each wait for upstream bytes: the first byte and every gap after it."""

    connect_s: float
    read_s: float
    total_s: float


@dataclass(frozen=True, slots=True)
class Deployment:
    name: str
    provider: str
    base_url: str
    upstream_model: str
    api_key: str | None
    timeouts: Timeouts
    max_connections: int
    pools: tuple[str, ...]
    cancel_grace_s: float = 0.1

    def __repr__(self) -> str:
        return f"Deployment({self.name!r}, {self.provider}, {self.base_url})"


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    deployments: tuple[Deployment, ...]


@dataclass(frozen=True, slots=True)
class Quota:
    """Limits on one caller (a tenant) or on all of them together (the aggregate)."""

    max_concurrency: int | None = None
    requests: Rate | None = None
    tokens: Rate | None = None


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """Per-route rules. `max_concurrency` is refused beyond, with no queue."""

    max_concurrency: int | None = None
    default_timeout_s: float = 600.0
    min_attempt_s: float = 0.05
    pool_wait_s: float = 0.0
    max_output_tokens: int = 4096
    max_prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    allowed_models: frozenset[str] | None
    quota: Quota = field(default_factory=Quota)
    max_prompt_tokens: int | None = None

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    max_concurrency: int
    requests: Rate | None = None
    tokens: Rate | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway needs at run time; `keys` maps sha256(key) to its tenant."""

    host: str
    port: int
    max_body_bytes: int
    models: dict[str, Model]
    tenants: tuple[Tenant, ...]
    keys: dict[bytes, Tenant]
    routes: dict[Endpoint, RoutePolicy]
    aggregate: Quota
    pools: dict[str, PoolSpec]
