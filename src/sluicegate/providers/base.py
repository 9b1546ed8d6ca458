"""The adapter boundary: what the pipeline may ask of any provider."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import orjson

from sluicegate.core.errors import CONTEXT_LENGTH, ErrorType, GatewayError, Upstream
from sluicegate.core.types import Deployment, Endpoint


class UpstreamResponse(Protocol):
    """An upstream answer that has started successfully (status < 400).

    `used_tokens` (prompt + completion) and `completion_tokens` are known once the body
    was read to the end and the provider reported usage; None otherwise.
    """

    used_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    """Prompt tokens read from the provider's prefix cache, when it reported them."""

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, unparsed; failures surface as `GatewayError`."""
        ...

    def hand_over(self) -> None:
        """We are about to end this answer to give its engine slot to another request:
        its call ends at once, without the grace an abandoned call keeps its permits."""
        ...


class Provider(Protocol):
    deployment: Deployment

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def open(
        self, endpoint: Endpoint, payload: dict[str, Any], budget_s: float
    ) -> AbstractAsyncContextManager[UpstreamResponse]:
        """Send the request, giving up after `budget_s` at most; the context ends only
        once the upstream call has ended."""
        ...


def classify_status(
    deployment: str, status: int, body: bytes, headers: Mapping[str, str]
) -> GatewayError:
    """Map an upstream error status to what the caller should see.

    The caller's own mistakes (400-class validation) pass through; a provider's
    auth or not-found errors are the gateway's misconfiguration (502); throttling
    is exhausted shared capacity (503, with the provider's Retry-After if any).
    """
    if 300 <= status < 400:
        return redirected(deployment, status)
    detail = _upstream_message(body)
    if status in (400, 413, 422):
        code = _upstream_code(body) or "invalid_request"
        if _CONTEXT_WORDS.search(detail):
            code = CONTEXT_LENGTH
        return GatewayError(400, code, detail, ErrorType.INVALID_REQUEST, should_retry=False)
    if status == 429:
        return GatewayError(
            503,
            Upstream.THROTTLED,
            f"deployment {deployment} is throttling: {detail}",
            ErrorType.UNAVAILABLE,
            retry_after_s=_retry_after(headers),
            failover=True,
        )
    if status in (401, 403, 404):
        message = f"deployment {deployment} refused the gateway ({status}): {detail}"
        return GatewayError(502, Upstream.MISCONFIGURED, message, ErrorType.UPSTREAM, failover=True)
    if status == 503:
        return GatewayError(
            503,
            Upstream.UNAVAILABLE,
            f"deployment {deployment} is unavailable: {detail}",
            ErrorType.UNAVAILABLE,
            retry_after_s=_retry_after(headers),
            failover=True,
        )
    return GatewayError(
        502,
        Upstream.ERROR,
        f"deployment {deployment} failed ({status}): {detail}",
        ErrorType.UPSTREAM,
        failover=True,
    )


def unreachable(deployment: str, exc: BaseException) -> GatewayError:
    message = f"deployment {deployment} is unreachable: {exc.__class__.__name__}"
    return GatewayError(502, Upstream.UNREACHABLE, message, ErrorType.UPSTREAM, failover=True)


def timed_out(deployment: str) -> GatewayError:
    message = f"deployment {deployment} did not answer in time"
    return GatewayError(504, Upstream.TIMEOUT, message, ErrorType.TIMEOUT, failover=True)


def interrupted(deployment: str, exc: BaseException | None = None) -> GatewayError:
    reason = f": {exc.__class__.__name__}" if exc is not None else ""
    message = f"deployment {deployment} ended the response early{reason}"
    return GatewayError(502, Upstream.INTERRUPTED, message, ErrorType.UPSTREAM, failover=True)


def redirected(deployment: str, status: int) -> GatewayError:
    """Redirects are never followed: one would replay the prompt and the deployment's
    credentials to another origin, or relay whatever that origin serves as the answer."""
    message = f"deployment {deployment} redirected the gateway ({status}), which never follows"
    return GatewayError(502, Upstream.MISCONFIGURED, message, ErrorType.UPSTREAM, failover=True)


def malformed(deployment: str, why: str = "a body the gateway cannot read") -> GatewayError:
    message = f"deployment {deployment} answered with {why}"
    return GatewayError(502, Upstream.MALFORMED, message, ErrorType.UPSTREAM, failover=True)


_CONTEXT_WORDS = re.compile(r"maximum context length|context window|prompt is too long", re.I)


def _parsed(body: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = value.get("error") if isinstance(value, dict) else None
    return error if isinstance(error, dict) else None


def _upstream_message(body: bytes) -> str:
    error = _parsed(body)
    if error is not None and isinstance(error.get("message"), str):
        return error["message"][:1000]
    return body[:200].decode("utf-8", "replace") or "(empty body)"


def _upstream_code(body: bytes) -> str | None:
    error = _parsed(body)
    code = error.get("code") if error is not None else None
    return code if isinstance(code, str) else None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None
