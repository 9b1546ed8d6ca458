"""The config file's schema. Unknown keys are errors: a typo must not silently do nothing."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, model_validator

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][\w.:/-]*$")]
Seconds = Annotated[float, Field(gt=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)


class QuotaConfig(Strict):
    """Rates are smooth (GCRA): a full minute's worth may arrive at once, then it refills."""

    max_concurrency: int | None = Field(default=None, ge=1)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


class TenantLimitsConfig(QuotaConfig):
    max_prompt_tokens: int | None = Field(default=None, ge=1)


class PoolConfig(Strict):
    name: Name
    max_concurrency: int = Field(ge=1)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


class RouteConfig(Strict):
    max_concurrency: int | None = Field(default=None, ge=1)
    default_timeout_s: Seconds = 600.0
    min_attempt_s: float = Field(default=0.05, ge=0)
    pool_wait_s: float = Field(default=0.0, ge=0)
    max_output_tokens: int = Field(default=4096, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=1)


class RoutesConfig(Strict):
    chat: RouteConfig = RouteConfig()
    completions: RouteConfig = RouteConfig()
    embeddings: RouteConfig = RouteConfig()


class TimeoutsConfig(Strict):
    connect_s: Seconds = 5.0
    read_s: Seconds = 60.0
    total_s: Seconds = 600.0


class DeploymentConfig(Strict):
    name: Name
    provider: Literal["openai"] = "openai"
    base_url: HttpUrl
    model: str | None = Field(default=None, description="upstream model name; default: public")
    api_key_env: str | None = None
    timeouts: TimeoutsConfig = TimeoutsConfig()
    max_connections: int = Field(default=256, ge=1)
    cancel_grace_s: float = Field(default=0.1, ge=0)
    pools: list[str] = Field(
        default_factory=list, description="pools gating this deployment; default: its own"
    )


class ModelConfig(Strict):
    name: Name
    deployments: list[DeploymentConfig] = Field(min_length=1)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class KeyConfig(Strict):
    """A key is given by its sha256 (hex) or read from an environment variable, never inline."""

    sha256: str | None = None
    env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> KeyConfig:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError("give exactly one of 'sha256' or 'env'")
        if self.sha256 is not None and not _SHA256.match(self.sha256):
            raise ValueError("'sha256' must be 64 lowercase hex characters")
        return self


class TenantConfig(Strict):
    name: Name
    keys: list[KeyConfig] = Field(min_length=1)
    models: list[str] | None = Field(default=None, description="allowed models; omit for all")
    limits: TenantLimitsConfig = TenantLimitsConfig()


class GatewayConfig(Strict):
    server: ServerConfig = ServerConfig()
    routes: RoutesConfig = RoutesConfig()
    aggregate: QuotaConfig = QuotaConfig()
    pools: list[PoolConfig] = Field(default_factory=list)
    models: list[ModelConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _cross_references(self) -> GatewayConfig:
        _unique("models", [m.name for m in self.models])
        deployments = [d for m in self.models for d in m.deployments]
        _unique("deployments", [d.name for d in deployments])
        _unique("tenants", [t.name for t in self.tenants])
        pools = {p.name for p in self.pools}
        _unique("pools", [p.name for p in self.pools])
        for deployment in deployments:
            unknown_pools = sorted(set(deployment.pools) - pools)
            if unknown_pools:
                raise ValueError(
                    f"deployment {deployment.name!r} names unknown pools {unknown_pools}"
                )
            if not deployment.pools and deployment.name in pools:
                raise ValueError(
                    f"deployment {deployment.name!r} has no pools but a pool has its name"
                )
        known = {m.name for m in self.models}
        for tenant in self.tenants:
            unknown = sorted(set(tenant.models or ()) - known)
            if unknown:
                raise ValueError(f"tenant {tenant.name!r} names unknown models {unknown}")
        return self


def _unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate name {name!r} in {what}")
        seen.add(name)
