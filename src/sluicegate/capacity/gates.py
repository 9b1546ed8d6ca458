"""Backend gates: may one more request be sent to this deployment for this lane now?

The pools bound how much the gateway may have in flight; a gate asks the backend
itself. `MetricsGate` reads the backend's own queue (vLLM metrics) and counts what was
sent since the last sample, so a burst between samples cannot overfill it.
`AimdGate` serves backends without metrics with an adaptive concurrency limit.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sluicegate.core.clock import Clock
from sluicegate.core.limits import Slot
from sluicegate.core.types import AdaptiveLimit, BackendMetrics, Lane


class GateState(enum.StrEnum):
    OPEN = "open"
    CLOSED = "closed"
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class BackendSample:
    """One scrape: gauges summed over the backend's models; histograms as running totals."""

    waiting: float
    running: float
    kv_usage: float | None
    tpot_sum: float | None
    tpot_count: float | None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    """Prompt tokens looked up in the prefix cache and found, as running totals."""


@dataclass(frozen=True, slots=True)
class BackendView:
    """What the backend's last scrape said, for operators: its requests running and
    waiting, its KV cache in use, and its time per output token since the scrape before."""

    running: float
    waiting: float
    kv_usage: float | None
    tpot_s: float | None


class BackendGate(Protocol):
    def admits(self, lane: Lane) -> bool: ...

    def fleet_slot(self, lane: Lane) -> Slot | None:
        """The bound on the whole fleet's attempts in flight to this backend for `lane`,
        decided with the pools (None: this replica's own estimate is the bound)."""
        ...

    def sent(self) -> None:
        """A request was dispatched to the backend."""
        ...

    def withdraw(self) -> None:
        """A `sent()` request did not go out after all (a pool refused it)."""
        ...

    def done(self, first_byte_s: float | None) -> None:
        """A dispatched request ended; `first_byte_s` is its time to first byte, when it
        is evidence of the backend's speed."""
        ...

    def state(self) -> GateState: ...

    @property
    def tpot_s(self) -> float | None:
        """The backend's time per output token over its last scrape, when its metrics
        are read (None otherwise): how fast its answers go now, slowdown included."""
        ...

    def on_change(self, listener: Callable[[], None]) -> None:
        """Called when the gate may have opened."""
        ...

    def load(self) -> Load | None:
        """How busy the backend is, as its metrics last said plus this gateway's sends
        since; None without a fresh sample."""
        ...


@dataclass(frozen=True, slots=True)
class Load:
    """A backend's requests running and waiting (the last sample's, plus what was sent
    since less what ended since), its batch when known (configured, else the most it
    was seen running), and its KV cache in use."""

    requests: float
    batch: int | None
    kv_usage: float | None


class _Listeners:
    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()


class OpenGate(_Listeners):
    """No backend signal: only the pools limit dispatch."""

    def admits(self, lane: Lane) -> bool:
        return True

    def fleet_slot(self, lane: Lane) -> Slot | None:
        return None

    def sent(self) -> None:
        return None

    def withdraw(self) -> None:
        return None

    def done(self, first_byte_s: float | None) -> None:
        return None

    def state(self) -> GateState:
        return GateState.OPEN

    @property
    def tpot_s(self) -> float | None:
        return None

    def load(self) -> Load | None:
        return None


class MetricsGate(_Listeners):
    """Dispatch while the backend's estimated waiting queue is within the lane's bound,
    its time per output token within the lane's SLO and its KV cache within the lane's
    ceiling. The estimate is the last sample's waiting plus what was sent since, minus
    what finished since; with the backend's `max_num_seqs` known, what was sent fills
    free slots first.

    In a fleet (`fleet_key` given) every replica's attempts in flight to the backend are
    leases under `fleet_key`, and each scrape comes with their count: the same bound is
    then also one more slot of the pools' decision, counting the whole fleet's sends
    since the sample, so that N replicas cannot each push up to the lane's bound."""

    def __init__(self, spec: BackendMetrics, clock: Clock, fleet_key: str | None = None) -> None:
        super().__init__()
        self._spec = spec
        self._clock = clock
        self.fleet_key = fleet_key
        self._fleet_at_sample: int | None = None
        self._sample: BackendSample | None = None
        self._sampled_s = float("-inf")
        self._tpot_s: float | None = None
        self._sent = 0
        self._done = 0
        self._most_running = 0.0
        """The most requests a sample showed running: the backend's batch, or a lower
        bound of it, where the config does not give `max_num_seqs`."""
        self.prefix_hit_ratio: float | None = None
        """Of the prompt tokens the backend looked up in its prefix cache between its last
        two scrapes with any, the share it found; None before."""

    @property
    def tpot_s(self) -> float | None:
        return self._tpot_s

    def view(self) -> BackendView | None:
        """The last scrape's figures; None before the first."""
        sample = self._sample
        if sample is None:
            return None
        return BackendView(sample.running, sample.waiting, sample.kv_usage, self._tpot_s)

    @property
    def estimated_waiting(self) -> float:
        sample = self._sample
        if sample is None:
            return 0.0
        since = self._sent - self._done
        slots = self._spec.max_num_seqs
        if slots is None:
            return max(0.0, sample.waiting + since)
        return max(0.0, sample.running + sample.waiting + since - slots)

    def update(self, sample: BackendSample, fleet_in_flight: int | None = None) -> None:
        """A new scrape, and the fleet's attempts in flight when it was read (None: not
        known, so this replica's own estimate bounds dispatch until the next one)."""
        self._fleet_at_sample = fleet_in_flight
        previous = self._sample
        if (
            previous is not None
            and sample.tpot_count is not None
            and previous.tpot_count is not None
            and sample.tpot_sum is not None
            and previous.tpot_sum is not None
            and sample.tpot_count > previous.tpot_count
        ):
            delta = sample.tpot_count - previous.tpot_count
            self._tpot_s = (sample.tpot_sum - previous.tpot_sum) / delta
        ratio = _ratio_since(previous, sample)
        if ratio is not None:
            self.prefix_hit_ratio = ratio
        self._sample = sample
        self._most_running = max(self._most_running, sample.running)
        self._sampled_s = self._clock.now()
        self._sent = self._done = 0
        self._changed()

    def admits(self, lane: Lane) -> bool:
        sample = self._sample
        if sample is None or self._stale():
            return self._spec.on_stale == "pools"
        return (
            self.estimated_waiting <= lane.max_backend_waiting
            and not _over(self._tpot_s, lane.tpot_slo_s)
            and not _over(sample.kv_usage, lane.max_kv_usage)
        )

    def fleet_slot(self, lane: Lane) -> Slot | None:
        """What `admits` allows (the estimated queue within the lane's bound before a
        send), as a limit on the fleet's attempts in flight: those at the sample plus
        the sends the sample leaves room for. The count and the scrape are not one
        instant: an attempt that ended at the backend before the scrape but still held
        its lease at the count, or was on its way there, is counted but not seen, so
        the limit could pass the backend's batch plus the bound by that many. With the
        batch known it never does: the fleet's own attempts alone could not fit more."""
        sample, at_sample = self._sample, self._fleet_at_sample
        if self.fleet_key is None or sample is None or at_sample is None or self._stale():
            return None
        slots = self._spec.max_num_seqs
        queued = sample.waiting if slots is None else sample.running + sample.waiting - slots
        bound = lane.max_backend_waiting
        limit = at_sample + math.floor(bound - queued) + 1
        if slots is not None:
            limit = min(limit, slots + math.floor(bound) + 1)
        return Slot(self.fleet_key, max(0, limit))

    def sent(self) -> None:
        self._sent += 1

    def withdraw(self) -> None:
        self._sent -= 1

    def done(self, first_byte_s: float | None) -> None:
        self._done += 1

    def state(self) -> GateState:
        if self._sample is None or self._stale():
            return GateState.STALE
        return GateState.OPEN if self.estimated_waiting == 0 else GateState.CLOSED

    def load(self) -> Load | None:
        sample = self._sample
        if sample is None or self._stale():
            return None
        requests = max(0.0, sample.running + sample.waiting + self._sent - self._done)
        batch = self._spec.max_num_seqs or math.ceil(self._most_running) or None
        return Load(requests, batch, sample.kv_usage)

    def _stale(self) -> bool:
        return self._clock.now() - self._sampled_s > self._spec.stale_after_s


class AimdGate(_Listeners):
    """Additive increase, multiplicative decrease on observed time to first byte: +1 to the
    limit per limit's worth of fast answers while the limit is in use, x`decrease` on a
    slow one (at most once per limit's worth of answers, so one burst is one signal)."""

    def __init__(self, spec: AdaptiveLimit) -> None:
        super().__init__()
        self._spec = spec
        self.limit = float(spec.initial)
        self.in_flight = 0
        self._since_change = 0

    def admits(self, lane: Lane) -> bool:
        return self.in_flight < int(self.limit)

    def fleet_slot(self, lane: Lane) -> Slot | None:
        return None

    def sent(self) -> None:
        self.in_flight += 1

    def withdraw(self) -> None:
        """The gate is as it was before the send: nothing opened that a listener waits on."""
        self.in_flight -= 1

    def done(self, first_byte_s: float | None) -> None:
        self.in_flight -= 1
        self._since_change += 1
        spec = self._spec
        if first_byte_s is not None and first_byte_s > spec.latency_target_s:
            if self._since_change >= self.limit / 2:
                self.limit = max(spec.minimum, self.limit * spec.decrease)
                self._since_change = 0
        elif self.in_flight + 1 >= self.limit / 2 and self._since_change >= self.limit:
            self.limit = min(spec.maximum, self.limit + 1)
            self._since_change = 0
        self._changed()

    def state(self) -> GateState:
        return GateState.OPEN if self.admits(Lane("any")) else GateState.CLOSED

    @property
    def tpot_s(self) -> float | None:
        return None

    def load(self) -> Load | None:
        return None


def _ratio_since(previous: BackendSample | None, sample: BackendSample) -> float | None:
    """Prefix-cache hits over queries between two samples; None when neither moved."""
    if previous is None:
        return None
    q0, h0 = previous.prefix_queries, previous.prefix_hits
    q1, h1 = sample.prefix_queries, sample.prefix_hits
    if q0 is None or h0 is None or q1 is None or h1 is None or q1 <= q0:
        return None
    return (h1 - h0) / (q1 - q0)


def _over(value: float | None, ceiling: float | None) -> bool:
    return value is not None and ceiling is not None and value > ceiling
