"""Client retry behaviour: full-jitter backoff that honours the server, or retrying at once."""

from __future__ import annotations

import random

import pytest

from sluicegate.bench.records import OK, Attempt
from sluicegate.bench.retry import Backoff, Immediate, NoRetry, backoff_delay_s, retry_hint_s

REFUSED = Attempt(0.0, 0.001, 503, "capacity_exhausted")


def answer(status: int, error: str, **headers: object) -> Attempt:
    return Attempt(0.0, 0.001, status, error, **headers)


@pytest.mark.parametrize("attempt", [1, 2, 3, 6])
def test_full_jitter_stays_inside_the_capped_exponential_window(attempt):
    rng = random.Random(attempt)
    window = min(4.0, 0.25 * 2 ** (attempt - 1))
    delays = [backoff_delay_s(attempt, 0.25, 4.0, None, rng) for _ in range(2000)]
    assert all(0.0 <= d <= window for d in delays)
    assert max(delays) > 0.9 * window
    assert min(delays) < 0.1 * window


def test_backoff_waits_at_least_what_the_server_asked():
    rng = random.Random(1)
    delays = [backoff_delay_s(1, 0.25, 4.0, 3.0, rng) for _ in range(200)]
    assert min(delays) == 3.0


def test_backoff_keeps_the_jitter_when_it_is_longer_than_the_hint():
    rng = random.Random(2)
    delays = [backoff_delay_s(5, 1.0, 16.0, 0.001, rng) for _ in range(200)]
    assert max(delays) > 1.0


def test_retry_hint_prefers_milliseconds_and_ignores_junk():
    assert retry_hint_s({"retry-after": "2", "retry-after-ms": "1500"}) == 1.5
    assert retry_hint_s({"retry-after": "2"}) == 2.0
    assert retry_hint_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_hint_s({"retry-after-ms": "-5"}) is None
    assert retry_hint_s({}) is None


def test_backoff_client_honours_retry_after_and_the_attempt_bound():
    policy = Backoff(policy="backoff", max_attempts=3, base_s=0.1, cap_s=1.0)
    rng = random.Random(3)
    hinted = answer(429, "tenant_rate_limited", retry_after_s=2.5)
    assert policy.delay_s(1, hinted, rng) == 2.5
    assert policy.delay_s(2, REFUSED, rng) is not None
    assert policy.delay_s(3, REFUSED, rng) is None


def test_backoff_client_stops_where_retrying_cannot_help():
    policy = Backoff(policy="backoff")
    rng = random.Random(4)
    assert policy.delay_s(1, answer(504, "deadline_exceeded", should_retry=False), rng) is None
    assert policy.delay_s(1, answer(400, "prompt_too_long"), rng) is None
    assert policy.delay_s(1, answer(200, OK), rng) is None
    assert policy.delay_s(1, answer(200, "stream_cut"), rng) is not None
    assert policy.delay_s(1, answer(0, "timeout"), rng) is not None


def test_immediate_client_retries_at_once_and_reads_no_header():
    policy = Immediate(policy="immediate", max_attempts=2)
    rng = random.Random(5)
    told_not_to = answer(503, "expired", should_retry=False, retry_after_s=9.0)
    assert policy.delay_s(1, told_not_to, rng) == 0.0
    assert policy.delay_s(2, told_not_to, rng) is None


def test_no_retry_never_retries():
    assert NoRetry(policy="none").delay_s(1, REFUSED, random.Random(6)) is None
