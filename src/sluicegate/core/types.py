"""The runtime snapshot of the configuration: plain frozen values, parsed once at start."""

from __future__ import annotations

import enum
from dataclasses import dataclass


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

    def __repr__(self) -> str:
        return f"Deployment({self.name!r}, {self.provider}, {self.base_url})"


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    deployments: tuple[Deployment, ...]


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    allowed_models: frozenset[str] | None

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway needs at run time; `keys` maps sha256(key) to its tenant."""

    host: str
    port: int
    max_body_bytes: int
    models: dict[str, Model]
    tenants: tuple[Tenant, ...]
    keys: dict[bytes, Tenant]
