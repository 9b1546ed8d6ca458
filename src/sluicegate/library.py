"""Library mode: the gateway's policies for a team that keeps its own provider client.

A `Governor` wires the same objects as `sluicegate serve` from the same config: tenant
limits, lanes, the fair queue, pools, backend gates and circuits, and, with
`store: redis`, the same keys as the proxy, so in-process callers and proxy traffic
share every limit. Each `attempt` goes through the pipeline entry HTTP requests use
(`Pipeline.run`); where the proxy would open the upstream, the pipeline is handed a
deployment whose call the caller makes itself:

    async with Governor.from_config("sluicegate.yaml") as governor:
        async with governor.attempt(
            model="llama-chat", tenant="t1", prompt_tokens=900, max_tokens=256
        ) as grant:
            reply = await client(grant.base_url).chat.completions.create(
                model=grant.upstream_model, ...
            )
            grant.report(reply.usage.prompt_tokens, reply.usage.completion_tokens)

A refusal raises `GatewayError` before the block runs (its `code`, `status` and
`retry_after_s` as the proxy would answer). An exception leaving the block counts as
the deployment's failure (the circuit breaker and adaptive limits hear of it) and is
re-raised; `grant.throttled(retry_after_s)` reports a provider's 429, which cools the
pools for every caller as a proxied one does. Retries and fallback are the caller's:
`grant.left` names the model's deployments not yet tried, and
`attempt(..., avoid=grant.tried)` puts those tried last.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from sluicegate.app import Runtime, build
from sluicegate.config import ConfigError, load_settings
from sluicegate.core.errors import (
    MAX_RETRY_AFTER_S,
    ErrorType,
    GatewayError,
    Upstream,
    bounded_retry_after,
)
from sluicegate.core.types import Deployment, Endpoint, Settings, Tenant
from sluicegate.pipeline import Inbound
from sluicegate.providers.base import UpstreamResponse
from sluicegate.stores.redis import inspect

log = logging.getLogger("sluicegate")

__all__ = ["ConfigError", "GatewayError", "Governor", "Grant"]


class Governor:
    """The policies of one config, running in this process while it is entered."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tenants = {tenant.name: tenant for tenant in settings.tenants}
        self._runtime: Runtime | None = None

    @classmethod
    def from_config(cls, path: str | Path, env: Mapping[str, str] | None = None) -> Governor:
        """Read `path` as `serve --config` does (`${VAR}` from `env`, else the process
        environment), less the callers' keys, which library mode never checks; a bad
        config raises `ConfigError` naming the field."""
        return cls(load_settings(path, os.environ if env is None else env, callers_keys=False))

    async def __aenter__(self) -> Governor:
        store_down = False
        policy = self.settings.redis
        if policy is not None:
            found = await inspect(policy.url)
            for line in found.unchecked:
                log.warning("%s", line)
            if found.unfit is not None:
                raise RuntimeError(f"{found.unfit}; not starting")
            problem = found.unreachable
            if problem is not None and policy.at_start == "fail":
                raise RuntimeError(f"{problem}; not starting (redis.at_start: fail)")
            store_down = problem is not None
        deployments = [d for m in self.settings.models.values() for d in m.deployments]
        providers = {d.name: CallerCalls(d) for d in deployments}
        runtime = build(self.settings, providers=providers, store_down=store_down)
        await runtime.start()
        self._runtime = runtime
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.stop()

    @asynccontextmanager
    async def attempt(
        self,
        model: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        *,
        lane: str | None = None,
        timeout_s: float | None = None,
        avoid: Iterable[str] = (),
    ) -> AsyncIterator[Grant]:
        """One model call's permits, held while the block runs: the tenant's and the
        route's slots and quotas, the lane's turn in the fair queue, the pools' permits
        and the backend gate's, for `prompt_tokens` in and at most `max_tokens` out.
        `timeout_s` bounds the wait for a turn (the route's default otherwise)."""
        runtime = self._runtime
        if runtime is None:
            raise RuntimeError("use the Governor inside `async with`")
        payload = {"model": model, "messages": [], "max_tokens": max_tokens}

        async def body() -> dict[str, Any]:
            return payload

        inbound = Inbound(
            Endpoint.CHAT,
            self._tenant(tenant),
            runtime.clock.now(),
            body,
            timeout_s,
            lane,
            prompt_tokens=prompt_tokens,
            avoid=frozenset(avoid),
        )
        async with runtime.pipeline.run(inbound) as answer:
            target = answer.attempt.target
            assert target is not None, "an answer always has its deployment"
            deployment = target.deployment
            tried = inbound.avoid | {deployment.name}
            upstream = answer.upstream
            assert isinstance(upstream, Reported)
            grant = Grant(
                deployment.name,
                deployment.base_url,
                deployment.upstream_model,
                deployment.api_key,
                tried,
                tuple(d.name for d in answer.call.model.deployments if d.name not in tried),
                upstream,
            )
            try:
                yield grant
            except Exception as err:
                if grant._throttling is None and not isinstance(err, GatewayError):
                    answer.attempt.end(caller_failed(deployment.name, err))
                raise
            finally:
                throttling = grant._throttling
                if throttling is not None:
                    answer.attempt.end(throttling)
                    await runtime.pipeline.throttled(target, throttling.retry_after_s)

    def _tenant(self, name: str) -> Tenant:
        tenant = self._tenants.get(name)
        if tenant is None:
            raise GatewayError(
                403,
                "tenant_not_found",
                f"no tenant {name!r} in the config",
                ErrorType.PERMISSION,
                should_retry=False,
            )
        return tenant


@dataclass(slots=True)
class Grant:
    """The deployment chosen for this attempt, what to call it with, and what is left."""

    deployment: str
    base_url: str
    upstream_model: str
    api_key: str | None
    tried: frozenset[str]
    """This attempt's deployment and the ones the caller asked to avoid."""
    left: tuple[str, ...]
    """The model's deployments not yet tried, for the caller's own fallback."""
    _usage: Reported = field(repr=False)
    _throttling: GatewayError | None = field(default=None, repr=False)

    def throttled(self, retry_after_s: float | None = None) -> None:
        """The provider answered 429 (`retry_after_s`: its Retry-After, if any): on exit
        the pools cool for every caller sharing them, proxy and library alike, for that
        long (else the deployment's `throttle_cooldown_s`, at most its `max_cooldown_s`),
        and the attempt counts as the deployment's failure, as a proxied 429 does."""
        bounded = bounded_retry_after(retry_after_s, MAX_RETRY_AFTER_S)
        message = f"deployment {self.deployment} is throttling (reported by the caller)"
        self._throttling = GatewayError(
            503,
            Upstream.THROTTLED,
            message,
            ErrorType.UNAVAILABLE,
            retry_after_s=bounded,
            failover=True,
        )

    def report(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        """The provider's usage: settles the token reservations as the proxy does with a
        usage it reads, and is what the attempt costs at its deployment's price (of the
        prompt, `cached_tokens` read from the provider's cache). Without it the
        reservation stands (counted as unsettled)."""
        self._usage.used_tokens = prompt_tokens + completion_tokens
        self._usage.completion_tokens = completion_tokens
        self._usage.cached_tokens = cached_tokens


def caller_failed(deployment: str, err: Exception) -> GatewayError:
    message = f"the caller's call to deployment {deployment} failed: {err.__class__.__name__}"
    return GatewayError(502, "upstream_error", message, ErrorType.UPSTREAM, failover=True)


class Reported:
    """The upstream answer of an attempt whose caller makes the call: nothing to read
    here, and the usage is what the caller reports."""

    __slots__ = ("cached_tokens", "completion_tokens", "used_tokens")

    def __init__(self) -> None:
        self.used_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None

    async def read(self) -> bytes:
        return b""

    async def chunks(self) -> AsyncIterator[bytes]:
        yield b""


class CallerCalls:
    """The provider of every deployment in library mode: the pipeline "opens" the
    upstream at once, and the caller's own client makes the call."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @asynccontextmanager
    async def open(
        self, endpoint: Endpoint, payload: dict[str, Any], budget_s: float
    ) -> AsyncIterator[UpstreamResponse]:
        yield Reported()
