"""The hot path between the HTTP edge and a provider, readable top to bottom.

The edge authenticates and reads the body; the pipeline does everything else in
order: concurrency gates (`enter`), resolving the model and the deadline
(`resolve`), quotas (`charge`), then one upstream `attempt` that takes a permit from
every pool of the chosen deployment. Every permit lives on an exit stack owned by the
caller's `async with`, so it is released exactly once, after the attempt has ended.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from sluicegate.admission.boundary import Boundary
from sluicegate.admission.estimate import Tokenizer, chars_over_four, output_tokens, prompt_tokens
from sluicegate.capacity.pools import Pool, PoolPermit
from sluicegate.core.call import Call
from sluicegate.core.clock import Clock
from sluicegate.core.errors import ErrorType, GatewayError, not_found
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Endpoint, Settings, Tenant
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.providers.base import Provider, UpstreamResponse


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        providers: Mapping[str, Sequence[Provider]],
        pools: Mapping[str, Pool],
        boundary: Boundary,
        metrics: GatewayMetrics,
        clock: Clock,
        tokenizer: Tokenizer = chars_over_four,
    ) -> None:
        self._models = settings.models
        self._routes = settings.routes
        self._boundary = boundary
        self._metrics = metrics
        self._clock = clock
        self._count = tokenizer
        self._rotations: dict[str, Iterator[Provider]] = {
            name: itertools.cycle(chain) for name, chain in providers.items()
        }
        self._pools_of = {
            d.name: tuple(pools[p] for p in d.pools)
            for model in settings.models.values()
            for d in model.deployments
        }

    async def enter(self, endpoint: Endpoint, tenant: Tenant, permits: AsyncExitStack) -> None:
        await self._boundary.enter(endpoint, tenant, permits)

    def resolve(
        self,
        tenant: Tenant,
        endpoint: Endpoint,
        payload: dict[str, Any],
        arrived_s: float,
        timeout_s: float | None,
    ) -> Call:
        name = payload["model"]
        model = self._models.get(name)
        if model is None:
            raise not_found(f"the model {name!r} does not exist", "model_not_found")
        if not tenant.may_use(name):
            raise GatewayError(
                403,
                "model_not_allowed",
                f"this key may not use the model {name!r}",
                ErrorType.PERMISSION,
                should_retry=False,
            )
        route = self._routes[endpoint]
        prompt = prompt_tokens(endpoint, payload, self._count)
        reserved = prompt + output_tokens(endpoint, payload, route.max_output_tokens)
        deadline = arrived_s + (route.default_timeout_s if timeout_s is None else timeout_s)
        stream = payload.get("stream") is True
        return Call(
            endpoint, tenant, model, route, payload, stream, arrived_s, deadline, prompt, reserved
        )

    async def charge(self, call: Call, permits: AsyncExitStack) -> None:
        await self._boundary.charge(call, permits)

    @asynccontextmanager
    async def attempt(self, call: Call) -> AsyncIterator[UpstreamResponse]:
        """One upstream attempt; it ends only when the upstream call has really ended."""
        provider = next(self._rotations[call.model.name])
        async with AsyncExitStack() as permits:
            for pool in self._pools_of[provider.deployment.name]:
                permit = await self._acquire(pool, call)
                permits.push_async_callback(_release, permit, call)
            call.dispatched_s = self._clock.now()
            budget_s = self._budget_s(call)
            try:
                async with provider.open(call.endpoint, call.payload, budget_s) as upstream:
                    try:
                        yield upstream
                    finally:
                        call.used_tokens = upstream.used_tokens
            except GatewayError as err:
                if err.status >= 500:
                    self._metrics.upstream_error(provider.deployment.name, err.code)
                raise

    async def _acquire(self, pool: Pool, call: Call) -> PoolPermit:
        """Take a pool permit; a configured wait never runs past what the deadline allows."""
        wait_s = min(
            call.route.pool_wait_s, max(0.0, self._budget_s(call) - call.route.min_attempt_s)
        )
        try:
            return await pool.acquire(call.reserved_tokens, wait_s)
        except GatewayError:
            self._budget_s(call)
            raise

    def _budget_s(self, call: Call) -> float:
        """The time left for the attempt; refuses when it cannot cover the minimum."""
        left = call.deadline_s - self._clock.now()
        if left < call.route.min_attempt_s:
            raise Refusal.DEADLINE.error(
                f"the request's deadline leaves {max(left, 0):.3f}s, less than the "
                f"{call.route.min_attempt_s:g}s an attempt needs"
            )
        return left


async def _release(permit: PoolPermit, call: Call) -> None:
    await permit.release(call.used_tokens)
