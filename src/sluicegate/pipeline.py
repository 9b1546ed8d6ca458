"""The hot path between the HTTP edge and a provider, readable top to bottom.

The edge hands in an authenticated tenant and a parsed body; the pipeline resolves
the model, chooses a deployment and opens the upstream attempt inside an exit stack
that the caller's `async with` always closes, whatever happens to the request.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sluicegate.core.errors import ErrorType, GatewayError, not_found
from sluicegate.core.types import Endpoint, Model, Tenant
from sluicegate.observability.metrics import GatewayMetrics
from sluicegate.providers.base import Provider, UpstreamResponse


@dataclass(slots=True)
class Call:
    """One admitted request: who, what, and when its caller's clock started."""

    endpoint: Endpoint
    tenant: Tenant
    model: Model
    payload: dict[str, Any]
    stream: bool
    arrived_s: float


class Pipeline:
    def __init__(
        self,
        models: Mapping[str, Model],
        providers: Mapping[str, Sequence[Provider]],
        metrics: GatewayMetrics,
    ) -> None:
        self._models = models
        self._metrics = metrics
        self._rotations: dict[str, Iterator[Provider]] = {
            name: itertools.cycle(chain) for name, chain in providers.items()
        }

    def resolve(
        self, tenant: Tenant, endpoint: Endpoint, payload: dict[str, Any], arrived_s: float
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
        return Call(endpoint, tenant, model, payload, payload.get("stream") is True, arrived_s)

    @asynccontextmanager
    async def attempt(self, call: Call) -> AsyncIterator[UpstreamResponse]:
        """One upstream attempt; it ends only when the upstream call has really ended."""
        provider = next(self._rotations[call.model.name])
        try:
            async with provider.open(call.endpoint, call.payload) as upstream:
                yield upstream
        except GatewayError as err:
            if err.status >= 500:
                self._metrics.upstream_error(provider.deployment.name, err.code)
            raise
