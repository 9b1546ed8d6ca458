"""Injected failures, changeable while the simulator runs, drawn from a seeded RNG.

The gateway's resilience tests need a backend that fails on demand and the same way
on every run, so every random draw comes from one `random.Random(seed)`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields

from sluicegate.core.errors import ErrorType, GatewayError


@dataclass(slots=True)
class Faults:
    """The current fault settings; `merge` is the only way they change after start.

    `hang` and `drop_after_tokens` are read when a request arrives, the other faults at
    each draw or step, so a change applies to new requests and (slowdown) the next step.

    The hostile ones: `retry_after_header` is the raw `Retry-After` text of an injected
    429 (any string, "inf" or "1000000000" included); `redirect_to` answers every
    OpenAI inference request and /metrics with a 307 there; `body_lie` answers an
    OpenAI inference request with a body that is not what it claims (see `BODY_LIES`);
    `metrics_lie` serves a /metrics that is not an exposition (see `METRICS_LIES`).
    The Anthropic face (/v1/messages) ignores the last three.
    """

    slowdown: float = 1.0
    error_rate: float = 0.0
    error_status: int = 500
    throttle_rate: float = 0.0
    throttle_retry_after_s: float | None = None
    hang: bool = False
    drop_after_tokens: int | None = None
    down: bool = False
    retry_after_header: str | None = None
    redirect_to: str | None = None
    body_lie: str | None = None
    metrics_lie: str | None = None

    def merge(self, changes: Mapping[str, object]) -> None:
        """Apply `changes` all-or-nothing; a ValueError names the first bad field."""
        checked = {}
        for name, value in changes.items():
            check = _CHECKS.get(name)
            if check is None:
                raise ValueError(f"unknown fault {name!r}")
            checked[name] = check(name, value)
        for name, value in checked.items():
            setattr(self, name, value)

    def reset(self) -> None:
        for field in fields(self):
            setattr(self, field.name, field.default)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number")
    return float(value)


def _slowdown(name: str, value: object) -> float:
    factor = _number(name, value)
    if factor <= 0:
        raise ValueError(f"{name} must be greater than 0")
    return factor


def _rate(name: str, value: object) -> float:
    rate = _number(name, value)
    if not 0 <= rate <= 1:
        raise ValueError(f"{name} must be between 0 and 1")
    return rate


def _status(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 400 <= value <= 599:
        raise ValueError(f"{name} must be an HTTP error status between 400 and 599")
    return value


def _retry_after(name: str, value: object) -> float | None:
    if value is None:
        return None
    seconds = _number(name, value)
    if seconds < 0:
        raise ValueError(f"{name} must be null or a number of seconds >= 0")
    return seconds


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def _drop_after(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be null or a whole number of tokens >= 0")
    return value


BODY_LIES = frozenset({"invalid_json", "html", "gzip", "oversized", "short"})
"""invalid_json: a cut JSON object; html: an HTML page under a JSON (or, streaming, an
HTML) content type; gzip: a gzip body the gateway never asked for; oversized: a valid
answer of about 1 MiB; short: a Content-Length 1,000 bytes longer than the body sent."""
METRICS_LIES = frozenset({"garbage", "nan", "huge"})
"""garbage: bytes that are no exposition; nan: vLLM's gauges at NaN; huge: 8 MiB of text."""


def _text(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be null or a non-empty string")
    return value


def _one_of(choices: frozenset[str]) -> Callable[[str, object], object]:
    def check(name: str, value: object) -> str | None:
        if value is not None and value not in choices:
            raise ValueError(f"{name} must be null or one of {', '.join(sorted(choices))}")
        return value  # type: ignore[return-value]

    return check


_CHECKS: dict[str, Callable[[str, object], object]] = {
    "slowdown": _slowdown,
    "error_rate": _rate,
    "error_status": _status,
    "throttle_rate": _rate,
    "throttle_retry_after_s": _retry_after,
    "hang": _flag,
    "drop_after_tokens": _drop_after,
    "down": _flag,
    "retry_after_header": _text,
    "redirect_to": _text,
    "body_lie": _one_of(BODY_LIES),
    "metrics_lie": _one_of(METRICS_LIES),
}

_TYPES_BY_STATUS = {
    401: ErrorType.AUTHENTICATION,
    403: ErrorType.PERMISSION,
    404: ErrorType.NOT_FOUND,
    429: ErrorType.RATE_LIMIT,
    503: ErrorType.UNAVAILABLE,
    504: ErrorType.TIMEOUT,
}


class FaultInjector:
    """Decides, per inference request, whether a fault answers it instead of the engine."""

    def __init__(self, faults: Faults, seed: int) -> None:
        self.faults = faults
        self._rng = random.Random(seed)

    def down_error(self) -> GatewayError | None:
        """The 503 that every inference route and /health answer while `down` is on."""
        if not self.faults.down:
            return None
        return GatewayError(503, "backend_down", "the backend is down", ErrorType.UNAVAILABLE)

    def refusal(self) -> GatewayError | None:
        """The error to answer at once, or None to serve the request."""
        faults = self.faults
        if faults.down:
            return self.down_error()
        if faults.error_rate and self._rng.random() < faults.error_rate:
            status = faults.error_status
            error_type = _TYPES_BY_STATUS.get(
                status, ErrorType.INVALID_REQUEST if status < 500 else ErrorType.INTERNAL
            )
            return GatewayError(status, "injected_error", f"injected error {status}", error_type)
        if faults.throttle_rate and self._rng.random() < faults.throttle_rate:
            return GatewayError(
                429,
                "rate_limit_exceeded",
                "too many requests (injected throttle)",
                ErrorType.RATE_LIMIT,
                retry_after_s=faults.throttle_retry_after_s,
            )
        return None
