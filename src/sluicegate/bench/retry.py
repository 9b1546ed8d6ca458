"""How a scenario's clients retry: not at all, at once, or with backoff and full jitter.

Retries are where overload feeds on itself, so the client's behaviour is part of the
scenario: an immediate-retry client multiplies the attempts a refusal causes, a backoff
client spreads them out and waits at least as long as the server asked.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from sluicegate.bench.records import Attempt
from sluicegate.config.schema import Strict

MAX_ATTEMPTS = 100
RETRYABLE_STATUSES = frozenset({0, 408, 409, 429, 500, 502, 503, 504})
"""No answer, overload, or a server fault. A 200 whose stream broke off is retried too."""

Attempts = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)]


def retryable(attempt: Attempt) -> bool:
    return not attempt.ok and (attempt.status in RETRYABLE_STATUSES or attempt.status == 200)


def retry_hint_s(headers: Mapping[str, str]) -> float | None:
    """retry-after-ms is finer than Retry-After; an HTTP-date or junk counts as no hint."""
    millis = _seconds(headers.get("retry-after-ms"))
    return _seconds(headers.get("retry-after")) if millis is None else millis / 1000


def backoff_delay_s(
    attempt: int, base_s: float, cap_s: float, hint_s: float | None, rng: random.Random
) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))], but never under the hint."""
    jitter = rng.uniform(0.0, min(cap_s, base_s * 2.0 ** (attempt - 1)))
    return jitter if hint_s is None else max(hint_s, jitter)


class NoRetry(Strict):
    policy: Literal["none"]
    announces: ClassVar[bool] = False

    def delay_s(self, attempts: int, last: Attempt, rng: random.Random) -> float | None:
        return None


class Immediate(Strict):
    """A naive client: sends again at once after any retryable failure, reading no header
    and sending none about its retries."""

    policy: Literal["immediate"]
    announces: ClassVar[bool] = False
    max_attempts: Attempts = 5

    def delay_s(self, attempts: int, last: Attempt, rng: random.Random) -> float | None:
        return 0.0 if attempts < self.max_attempts and retryable(last) else None


class Backoff(Strict):
    """A careful client, like the `openai` SDKs: honours `x-should-retry: false`,
    Retry-After and retry-after-ms, and numbers its retries (`x-stainless-retry-count`)."""

    policy: Literal["backoff"]
    announces: ClassVar[bool] = True
    max_attempts: Attempts = 5
    base_s: Annotated[float, Field(gt=0)] = 0.5
    cap_s: Annotated[float, Field(gt=0)] = 20.0

    def delay_s(self, attempts: int, last: Attempt, rng: random.Random) -> float | None:
        if attempts >= self.max_attempts or not retryable(last) or last.should_retry is False:
            return None
        return backoff_delay_s(attempts, self.base_s, self.cap_s, last.retry_after_s, rng)


Retry = Annotated[NoRetry | Immediate | Backoff, Field(discriminator="policy")]


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None
