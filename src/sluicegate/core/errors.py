"""Errors the gateway answers with, independent of how they reach the wire."""

from __future__ import annotations

import asyncio
import enum
import math


class ErrorType(enum.StrEnum):
    """OpenAI's error `type` values, plus the gateway's own."""

    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    PERMISSION = "permission_error"
    NOT_FOUND = "not_found_error"
    RATE_LIMIT = "rate_limit_error"
    UNAVAILABLE = "service_unavailable_error"
    TIMEOUT = "timeout_error"
    UPSTREAM = "upstream_error"
    INTERNAL = "internal_error"


CONTEXT_LENGTH = "context_length_exceeded"


class Upstream(enum.StrEnum):
    """The closed list of upstream failures: the wire's error `code` and the metric's
    label. Each is the deployment's failure, so another attempt may do better."""

    ERROR = "upstream_error"
    UNREACHABLE = "upstream_unreachable"
    INTERRUPTED = "upstream_interrupted"
    MISCONFIGURED = "upstream_misconfigured"
    """It refused the gateway's credentials or model, or redirected it elsewhere."""
    MALFORMED = "upstream_malformed"
    """Its answer is not what it claims: invalid JSON, a wrong content type or
    encoding, a body over the bound or shorter than its length."""
    THROTTLED = "upstream_throttled"
    UNAVAILABLE = "upstream_unavailable"
    TIMEOUT = "upstream_timeout"


MAX_RETRY_AFTER_S = 86_400.0
"""No Retry-After the gateway writes is longer than a day, whatever a limit or a peer said."""


class CallerGone(Exception):
    """The caller went away; whatever it was waiting for has been cancelled."""


class GatewayError(Exception):
    """A refusal or failure with everything needed to answer it.

    `retry_after_s` is set only when a meaningful time is known (a rate window, a
    provider's own Retry-After, a cooldown's end), never guessed from a permit count.
    `failover` marks an upstream failure that another attempt (another deployment, or
    the same one later) may not have: connection failures, timeouts, 5xx, throttling.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        error_type: ErrorType,
        *,
        retry_after_s: float | None = None,
        should_retry: bool | None = None,
        failover: bool = False,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.error_type = error_type
        self.retry_after_s = bounded_retry_after(retry_after_s, MAX_RETRY_AFTER_S)
        self.should_retry = should_retry
        self.failover = failover
        self.param = param
        """The request field the error is about, as OpenAI's errors name it."""

    def renewed(self) -> GatewayError:
        """A fresh copy to raise. An error kept where the raising frame can reach it (a
        queued request's future) must not be raised itself: its traceback would point
        back at that frame, a reference cycle left for the garbage collector."""
        return GatewayError(
            self.status,
            self.code,
            self.message,
            self.error_type,
            retry_after_s=self.retry_after_s,
            should_retry=self.should_retry,
            failover=self.failover,
            param=self.param,
        )


def bounded_retry_after(seconds: float | None, ceiling_s: float) -> float | None:
    """`seconds` held to [0, `ceiling_s`]; None for no time or a time that is no number
    (NaN, infinity): a Retry-After is only ever a real, finite wait."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), ceiling_s)


def bad_request(
    message: str, code: str = "invalid_request", param: str | None = None
) -> GatewayError:
    return GatewayError(
        400, code, message, ErrorType.INVALID_REQUEST, should_retry=False, param=param
    )


def not_found(message: str, code: str = "not_found") -> GatewayError:
    return GatewayError(404, code, message, ErrorType.NOT_FOUND, should_retry=False)


SHUTTING_DOWN = "the server is shutting down"
"""The message a request cut at the end of the stop's grace period is cancelled with, so
whoever records its end can tell it from a caller who left."""


def cut_by_shutdown(error: BaseException | None) -> bool:
    return isinstance(error, asyncio.CancelledError) and error.args == (SHUTTING_DOWN,)


def shutting_down() -> GatewayError:
    return GatewayError(
        503,
        "server_shutting_down",
        "the server stopped before the answer was complete; retry on another replica",
        ErrorType.UNAVAILABLE,
        should_retry=True,
    )
