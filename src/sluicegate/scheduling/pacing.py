"""Pacing: may lane L dispatch now, at its pace?

Two paces hold a lane back, whatever the target: its own `max_dispatch_rate`, and, below
a top lane with a time-to-first-token target, the rate the lower lanes yield to it
(`yielding.Yielding`). While a streamed top-lane request waits for its first token,
the lower lanes do not dispatch at all: a background prefill sent now would share its
engine steps and delay exactly the first tokens the target protects. The rest of a
handed-over answer is held to neither: its caller is mid-answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sluicegate.core.clock import Clock
from sluicegate.core.refusals import Refusal
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.plugin import Dispatch, NotNow, Quiet
from sluicegate.scheduling.yielding import Yielding


class Pacing(Quiet):
    name = "pacing"
    lane_wide = True
    holds_rests = False

    def __init__(
        self,
        lanes: Sequence[Lane],
        clock: Clock,
        wake: Callable[[], None],
        yields: bool = True,
    ) -> None:
        self._top = max(lanes, key=lambda lane: lane.priority)
        target = self._top.ttft_target_s if yields else None
        self.yielding = None if target is None else Yielding(target, clock)
        self._clock = clock
        self._wake = wake
        self._next_dispatch_s: dict[str, float] = {}
        self._prefilling: set[int] = set()
        """Streamed top-lane requests dispatched and still waiting for their first token,
        while lower lanes yield."""
        self.listening = self.yielding is not None or any(
            lane.max_dispatch_rate is not None for lane in lanes
        )
        """Without a pace to keep, there is nothing to hear."""

    def applies(self, target: Target, lane: Lane) -> bool:
        return lane.max_dispatch_rate is not None or self._yields(lane)

    def check(self, target: Target, lane: Lane) -> NotNow | None:
        yields = self._yields(lane)
        if yields and self._prefilling:
            return NotNow(Refusal.LANE_YIELDING, f"lane {lane.name} yields to first tokens due")
        paced = 0.0
        if lane.max_dispatch_rate is not None:
            paced = self._next_dispatch_s.get(lane.name, 0.0) - self._clock.now()
        if yields:
            assert self.yielding is not None
            paced = max(paced, self.yielding.wait_s())
        if paced > 0:
            return NotNow(Refusal.LANE_PACED, f"lane {lane.name} is paced", paced, paced)
        return None

    def dispatched(self, attempt: Attempt, how: Dispatch) -> None:
        lane, now = attempt.lane, self._clock.now()
        if self._yields(lane):
            assert self.yielding is not None
            self.yielding.dispatched()
        elif self.yielding is not None and lane is self._top and attempt.call.stream:
            self._prefilling.add(id(attempt))
        rate = lane.max_dispatch_rate
        if rate is not None:
            earliest = max(self._next_dispatch_s.get(lane.name, now), now)
            self._next_dispatch_s[lane.name] = earliest + 1.0 / rate

    def taken(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        return None

    def withdrawn(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        return None

    def released(self, target: Target, lane: Lane, attempt: Attempt) -> None:
        return None

    def first_token(self, attempt: Attempt, ttft_s: float) -> None:
        """The rest of an answer that gave its slot away came after a prefill of the
        answer so far: its time says nothing of the top lane's first tokens."""
        if self.yielding is not None and attempt.lane is self._top and not attempt.call.resumed:
            self.yielding.observe(ttft_s)
        self._prefilled(attempt)

    def ended(self, attempt: Attempt) -> None:
        self._prefilled(attempt)

    def _prefilled(self, attempt: Attempt) -> None:
        """`attempt` no longer waits for its first token: lower lanes may go once none
        does."""
        prefilling = self._prefilling
        if id(attempt) in prefilling:
            prefilling.discard(id(attempt))
            if not prefilling:
                self._wake()

    def _yields(self, lane: Lane) -> bool:
        return self.yielding is not None and lane.priority < self._top.priority

    def view(self) -> Mapping[str, Any]:
        yielding = self.yielding
        if yielding is None:
            return {"yields": False}
        return {"yields": True, "rate_per_s": yielding.rate_per_s, "cuts": yielding.cuts}
