"""The closed list of refusal reasons: the wire's error `code` and the metric's `reason` label.

A caller over its own quota gets 429; exhausted shared capacity gets 503. A
`Retry-After` is attached only where the refusing limit knows a real time.
"""

from __future__ import annotations

import enum

from sluicegate.core.errors import ErrorType, GatewayError


class Refusal(enum.StrEnum):
    TENANT_CONCURRENCY = "tenant_concurrency_limited"
    TENANT_RATE = "tenant_rate_limited"
    TENANT_TOKENS = "tenant_token_limited"
    CAPACITY = "capacity_exhausted"
    POOL_CONCURRENCY = "pool_concurrency_limited"
    POOL_RATE = "pool_rate_limited"
    POOL_TOKENS = "pool_token_limited"
    POOL_COOLING = "pool_cooling_down"
    DEADLINE = "deadline_exceeded"
    PROMPT_TOO_LONG = "prompt_too_long"
    TOO_COSTLY = "request_too_costly"
    BODY_TOO_LARGE = "body_too_large"
    BODY_BUDGET = "body_budget_exhausted"
    QUEUE_FULL = "queue_full"
    EXPIRED = "expired"
    BACKEND_BUSY = "backend_busy"
    OVERLOADED = "overloaded"
    SHED = "shed"
    CIRCUIT_OPEN = "circuit_open"
    RAMPING = "deployment_ramping_up"
    LANE_SHARE = "lane_share_exhausted"
    LANE_PACED = "lane_paced"
    LANE_BACKLOGGED = "lane_backlogged"
    STORE_UNAVAILABLE = "limit_store_unavailable"
    GUARDRAIL_BLOCKED = "guardrail_blocked"
    GUARDRAIL_UNAVAILABLE = "guardrail_unavailable"
    BUDGET = "budget_exceeded"

    @property
    def status(self) -> int:
        return _STATUS[self]

    def error(self, message: str, retry_after_s: float | None = None) -> GatewayError:
        status = self.status
        hopeless = self in _HOPELESS or retry_after_s == float("inf")
        return GatewayError(
            status,
            self.value,
            message,
            _TYPE[status],
            retry_after_s=None if hopeless else retry_after_s,
            should_retry=False if hopeless else None,
        )


_STATUS = {
    Refusal.TENANT_CONCURRENCY: 429,
    Refusal.TENANT_RATE: 429,
    Refusal.TENANT_TOKENS: 429,
    Refusal.CAPACITY: 503,
    Refusal.POOL_CONCURRENCY: 503,
    Refusal.POOL_RATE: 503,
    Refusal.POOL_TOKENS: 503,
    Refusal.POOL_COOLING: 503,
    Refusal.DEADLINE: 504,
    Refusal.PROMPT_TOO_LONG: 400,
    Refusal.TOO_COSTLY: 400,
    Refusal.BODY_TOO_LARGE: 413,
    Refusal.BODY_BUDGET: 503,
    Refusal.QUEUE_FULL: 503,
    Refusal.EXPIRED: 503,
    Refusal.BACKEND_BUSY: 503,
    Refusal.OVERLOADED: 503,
    Refusal.SHED: 503,
    Refusal.CIRCUIT_OPEN: 503,
    Refusal.RAMPING: 503,
    Refusal.LANE_SHARE: 503,
    Refusal.LANE_PACED: 503,
    Refusal.LANE_BACKLOGGED: 503,
    Refusal.STORE_UNAVAILABLE: 503,
    Refusal.GUARDRAIL_BLOCKED: 400,
    Refusal.GUARDRAIL_UNAVAILABLE: 503,
    Refusal.BUDGET: 429,
}
_TYPE = {
    429: ErrorType.RATE_LIMIT,
    503: ErrorType.UNAVAILABLE,
    504: ErrorType.TIMEOUT,
    400: ErrorType.INVALID_REQUEST,
    413: ErrorType.INVALID_REQUEST,
}
_HOPELESS = frozenset(
    {
        Refusal.DEADLINE,
        Refusal.PROMPT_TOO_LONG,
        Refusal.TOO_COSTLY,
        Refusal.BODY_TOO_LARGE,
        Refusal.EXPIRED,
        Refusal.GUARDRAIL_BLOCKED,
    }
)
