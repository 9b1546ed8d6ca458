"""Did a request meet its lane's SLOs? The judgement, the timeline it reads, the recent tally.

On the gateway's clock: TTFT runs from the request's arrival to the first content byte
handed to its caller; TPOT is (last token - first token) / (completion tokens - 1), over
streams of at least two tokens; the end-to-end time runs from arrival to the answer's
end. A request *met* its lane's SLOs when it succeeded within every one the lane sets
(a lane with none counts success as met). Otherwise its outcome names the first SLO it
missed, or its refusal or failure code, and its kind says which of offered, accepted
and met it counts in.
"""

from __future__ import annotations

import enum
import math
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any, NamedTuple

from sluicegate.core.types import Lane


class Kind(enum.StrEnum):
    MET = "met"
    MISSED = "missed"
    """Succeeded outside an SLO of its lane, or its caller left once one had passed."""
    FAILED = "failed"
    """Accepted and failed: the deployments' failures, the gateway's own errors."""
    REFUSED = "refused"
    """Refused by the gateway's limits, at once or after a wait in a queue."""
    INVALID = "invalid"
    """The caller's own error: not accepted, so not judged."""
    ABANDONED = "abandoned"
    """Its caller left before any SLO had passed: no verdict either way."""


ACCEPTED = frozenset({Kind.MET, Kind.MISSED, Kind.FAILED})
"""The kinds of an accepted request that finished: what attainment divides by."""


class Verdict(NamedTuple):
    outcome: str
    """`met`, the SLO missed first (`ttft_missed`, `tpot_missed`, `e2e_missed`), or the
    refusal or failure code."""
    kind: Kind


MET = Verdict("met", Kind.MET)
ABANDONED = Verdict("abandoned", Kind.ABANDONED)


class Timeline:
    """When a request passed each stage before its first byte: set by the pipeline as
    they pass, read by the edge's Server-Timing and the SLO accounting. A stage not
    reached is None."""

    __slots__ = (
        "admitted_s",
        "arrived_s",
        "checked_s",
        "dispatched_s",
        "first_byte_s",
        "guarded_s",
        "upstream_s",
    )

    def __init__(self, arrived_s: float) -> None:
        self.arrived_s = arrived_s
        self.admitted_s: float | None = None
        """Past the tenant's and the shared gates, its body read."""
        self.guarded_s: float | None = None
        """Past its pre-call guardrails; None when it had none."""
        self.dispatched_s: float | None = None
        """The attempt that answered went out to its deployment."""
        self.upstream_s: float | None = None
        """That deployment's first bytes (a non-streamed answer's whole body) arrived."""
        self.checked_s: float | None = None
        """A non-streamed answer passed its post-call and parallel checks; None when it
        had none."""
        self.first_byte_s: float | None = None
        """The first content byte was handed to the caller."""

    def stages(self, now: float) -> list[tuple[str, float]]:
        """The time spent in each stage reached before the first byte, the last one
        counted up to `now` when the request ends there: admission (gates and body),
        guardrail (pre-call checks, only when it had any), queue (waiting for a turn,
        earlier attempts of a retried request included), upstream (the deployment's
        queue and prefill), answer_check (a non-streamed answer's post-call and parallel
        checks, only when it had any) and transfer (to the caller)."""
        found = []
        start = self.arrived_s
        marks = [("admission", self.admitted_s)]
        if self.guarded_s is not None:
            marks.append(("guardrail", self.guarded_s))
        marks += [
            ("queue", self.dispatched_s),
            ("upstream", self.upstream_s),
        ]
        if self.checked_s is not None:
            marks.append(("answer_check", self.checked_s))
        for name, mark in marks:
            if mark is None:
                found.append((name, now - start))
                return found
            found.append((name, mark - start))
            start = mark
        if self.first_byte_s is not None:
            found.append(("transfer", self.first_byte_s - start))
        return found

    def ttft_s(self) -> float | None:
        return None if self.first_byte_s is None else self.first_byte_s - self.arrived_s


def tpot_s(first_s: float, last_s: float, completion_tokens: int | None) -> float | None:
    """Time per output token after the first; None below two tokens or without usage."""
    if completion_tokens is None or completion_tokens < 2:
        return None
    return (last_s - first_s) / (completion_tokens - 1)


def judge_answer(lane: Lane, timeline: Timeline, ended_s: float, tpot: float | None) -> Verdict:
    """A request that succeeded: met, or the first of its lane's SLOs it missed."""
    ttft = timeline.ttft_s()
    if lane.ttft_slo_s is not None and (ttft is None or ttft > lane.ttft_slo_s):
        return Verdict("ttft_missed", Kind.MISSED)
    if lane.tpot_slo_s is not None and tpot is not None and tpot > lane.tpot_slo_s:
        return Verdict("tpot_missed", Kind.MISSED)
    if lane.e2e_slo_s is not None and ended_s - timeline.arrived_s > lane.e2e_slo_s:
        return Verdict("e2e_missed", Kind.MISSED)
    return MET


def judge_left(lane: Lane | None, timeline: Timeline, left_s: float) -> Verdict:
    """A request whose caller left: it missed an SLO that had already passed, else it
    has no verdict."""
    if lane is None:
        return ABANDONED
    waited = left_s - timeline.arrived_s
    if lane.ttft_slo_s is not None and timeline.first_byte_s is None and waited > lane.ttft_slo_s:
        return Verdict("ttft_missed", Kind.MISSED)
    if lane.e2e_slo_s is not None and waited > lane.e2e_slo_s:
        return Verdict("e2e_missed", Kind.MISSED)
    return ABANDONED


def judge_error(code: str, status: int, refused: bool) -> Verdict:
    """A request answered with an error: a refusal of the gateway's limits, the caller's
    own error, or a failure."""
    if refused:
        return Verdict(code, Kind.REFUSED)
    if status < 500:
        return Verdict(code, Kind.INVALID)
    return Verdict(code, Kind.FAILED)


Tally = Counter[Kind]


class RecentOutcomes:
    """Outcomes by kind over the last `window_s`, per key (a lane of a model, a tenant in
    a lane), kept in `buckets` slices so that the oldest fall away whole. Keys come from
    the configuration, so the map is bounded."""

    def __init__(self, window_s: float = 300.0, buckets: int = 30) -> None:
        self.window_s = window_s
        self._slice_s = window_s / buckets
        self._slices: deque[tuple[int, dict[tuple[str, str, str], Tally]]] = deque()

    def add(self, key: tuple[str, str, str], kind: Kind, now: float) -> None:
        index = int(now // self._slice_s)
        slices = self._slices
        if not slices or slices[-1][0] != index:
            slices.append((index, {}))
            self._forget(index)
        counts = slices[-1][1]
        tally = counts.get(key)
        if tally is None:
            tally = counts[key] = Counter()
        tally[kind] += 1

    def totals(self, now: float) -> Mapping[tuple[str, str, str], Tally]:
        """Every key's outcomes within the window ending `now`."""
        self._forget(int(now // self._slice_s))
        totals: dict[tuple[str, str, str], Tally] = {}
        for _, counts in self._slices:
            for key, tally in counts.items():
                totals.setdefault(key, Counter()).update(tally)
        return totals

    def _forget(self, index: int) -> None:
        oldest = index - round(self.window_s / self._slice_s) + 1
        while self._slices and self._slices[0][0] < oldest:
            self._slices.popleft()


def figures(tally: Tally, window_s: float) -> dict[str, float | int | None]:
    """What an operator reads of one key's recent outcomes: counts by kind, offered,
    accepted, met, attainment and goodput per second over the window."""
    accepted = sum(tally[kind] for kind in ACCEPTED)
    met = tally[Kind.MET]
    return {
        "offered": sum(tally.values()),
        "accepted": accepted,
        **{kind.value: tally[kind] for kind in Kind},
        "attainment": attainment(met, accepted),
        "goodput_per_s": round(met / window_s, 3),
    }


def attainment(met: float, accepted: float) -> float | None:
    """Met over accepted requests that finished; None before any."""
    return round(met / accepted, 4) if accepted else None


HISTORY_S = 300
"""Seconds of offered, accepted and met counts the gateway keeps for the status page."""


class LoadHistory:
    """Offered, accepted and met requests per whole second of the clock, for the last
    `seconds` of them: a ring of at most `seconds` entries, so memory stays bounded
    however long the gateway runs. Seconds are the clock's own, which every worker of
    one host reads alike (CLOCK_MONOTONIC), so the workers' rings merge second by
    second."""

    def __init__(self, seconds: int = HISTORY_S) -> None:
        self.seconds = seconds
        self._ring: deque[tuple[int, list[int]]] = deque(maxlen=seconds)

    def add(self, kind: Kind, now: float) -> None:
        second = math.floor(now)
        ring = self._ring
        if not ring or ring[-1][0] != second:
            ring.append((second, [0, 0, 0]))
        counts = ring[-1][1]
        counts[0] += 1
        if kind in ACCEPTED:
            counts[1] += 1
            if kind is Kind.MET:
                counts[2] += 1

    def view(self, now: float) -> dict[str, Any]:
        """The seconds within the window ending at `now` that saw a request, by second
        (a string, as JSON keys are), and the current second as `now_s`."""
        current = math.floor(now)
        oldest = current - self.seconds + 1
        return {
            "now_s": current,
            "seconds": {
                str(second): {"offered": offered, "accepted": accepted, "met": met}
                for second, (offered, accepted, met) in self._ring
                if second >= oldest
            },
        }
