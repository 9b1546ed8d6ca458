"""What a scenario run records: one `Record` per request, one `Attempt` per try of it.

Times are seconds since the run started, so records from one run line up with each other
and with the metrics scraped during it. This module depends on nothing else in the bench.
"""

from __future__ import annotations

from dataclasses import dataclass

OK = "ok"
UNFINISHED = "unfinished"
"""A request still running when the run's drain time ran out; it was cancelled."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP exchange. `status` 0 means no answer (timeout, connection failure)."""

    start_s: float
    end_s: float
    status: int
    error: str = OK
    retry_after_s: float | None = None
    should_retry: bool | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    backend_prefill_s: float | None = None
    """The simulator's own time from taking the request into its batch to its first token
    (its `sim_timing`); None from any other backend."""
    gateway_queue_s: float | None = None
    """The gateway's own time from the request's arrival to its dispatch (its
    Server-Timing `admission` and `queue`); None without a gateway in front."""
    longest_gap_s: float | None = None
    """The longest time between two events carrying output: how long the answer stood
    still (a slot handed over pauses it); None before a second such event."""

    @property
    def ok(self) -> bool:
        return self.error == OK

    @property
    def outcome(self) -> str:
        """The status-count label: HTTP status and error kind, e.g. `429 tenant_rate_limited`."""
        return f"{self.status} {self.error}"


@dataclass(frozen=True, slots=True)
class Record:
    """A request as its caller saw it, from its first send to the end of its last attempt."""

    tenant: str
    lane: str
    flow: int
    stream: bool
    start_s: float
    attempts: tuple[Attempt, ...]
    asked_prompt_tokens: int = 0
    asked_output_tokens: int = 0
    """What the request asked for (prompt, max output tokens), served or not: its demand."""

    @property
    def last(self) -> Attempt:
        return self.attempts[-1]

    @property
    def ok(self) -> bool:
        return self.last.ok

    @property
    def end_s(self) -> float:
        return self.last.end_s

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def ttft_s(self) -> float | None:
        """From the first send, retries and their waits included: the wait the caller had.

        A non-streamed answer brings its first token with its whole body.
        """
        if not self.ok:
            return None
        first = self.last.first_token_s if self.stream else self.end_s
        return None if first is None else first - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time between output tokens of a successful stream; None for one token."""
        last = self.last
        if not (self.ok and self.stream and last.output_tokens > 1):
            return None
        if last.first_token_s is None or last.last_token_s is None:
            return None
        return (last.last_token_s - last.first_token_s) / (last.output_tokens - 1)

    @property
    def queue_wait_s(self) -> float | None:
        """TTFT less the backend's own prefill: all the caller waited before the backend
        began its request (gateway queue, backend queue, retries), whoever queued it."""
        ttft, prefill = self.ttft_s, self.last.backend_prefill_s
        return None if ttft is None or prefill is None else max(0.0, ttft - prefill)

    @property
    def gateway_wait_s(self) -> float | None:
        """The part of the wait the gateway itself held a served request: from its first
        send to its last attempt (attempts the gateway refused, and the caller's backoff
        after them), then that attempt's time from arrival to dispatch (Server-Timing)."""
        held = self.last.gateway_queue_s
        if not self.ok or held is None:
            return None
        return self.last.start_s - self.attempts[0].start_s + held

    @property
    def waiting_until_s(self) -> float:
        """When the caller stopped waiting for service: its first token, else its end."""
        first = self.last.first_token_s if self.ok and self.stream else None
        return self.end_s if first is None else first

    @property
    def service_tokens(self) -> int:
        """Tokens the backend processed for a successful request (prompt and output)."""
        return self.last.prompt_tokens + self.last.output_tokens if self.ok else 0
