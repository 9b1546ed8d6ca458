"""Is this arrival within its tenant's share?

A top-lane request that comes while its tenant holds and queues less than its max-min
fair share of the deployments' batch is *within share*: it may take the slots the
reserve keeps free, it stands before the requests beyond a share, and it is not shed.
Judged once, as it comes, as the share is promised: a request sent beyond it does not
come within by waiting, nor by coming back (a retry its caller announces, the
gateway's own next attempt or its hedge was judged when it first came; counted again it
would take the reserve from the requests within their share while its tenant's backoff
hides its demand). Among the requests within their share, the tenant that asked the
least of the engine lately goes first (`RecentWork`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sluicegate.core.call import Call
from sluicegate.core.clock import Clock
from sluicegate.core.types import Lane
from sluicegate.scheduling.attempt import Attempt
from sluicegate.scheduling.fairness import Shares

HORIZON_S = 2.0
"""Over how long a tenant's asked work is counted when the top lane makes no promise;
with one, the promise: a tenant is judged over the time its request may be kept."""
FORGOTTEN = 1e-6
"""Work below this fraction of its last value is forgotten with its tenant: the map walks
only the tenants active lately."""

WorkS = Callable[[int, int, float | None], float | None]
"""The engine seconds a request of so many prompt and output tokens asks, at a prefill
rate (`demand.EngineUnit.work_s`)."""


class WithinShare:
    def __init__(
        self,
        top: Lane,
        shares: Shares,
        queued: Callable[[str], int],
        batch: int,
        clock: Clock,
        work_s: WorkS,
        prefill_rates: Callable[[], list[float]],
        judges: bool = True,
    ) -> None:
        self._top = top
        self._judges = judges
        """Off: no request is within its share."""
        self._shares = shares
        self._queued = queued
        """Each tenant's requests waiting in the top lane."""
        self._batch = batch
        self._clock = clock
        self._work_s = work_s
        self._prefill_rates = prefill_rates
        promise = top.ttft_slo_s
        self._recent = RecentWork(HORIZON_S if promise is None else promise)
        """Work each tenant asked lately in the top lane: the order among the requests
        within their share."""

    def judge(self, attempt: Attempt) -> bool:
        lane, call = attempt.lane, attempt.call
        if lane is not self._top or not self._judges:
            return False
        if call.client_retries or call.resumed or attempt.number > 1 or attempt.hedge:
            return False
        self._note_asked(call)
        return self._shares.within_share(call.tenant.name, self._queued, self._batch)

    def _note_asked(self, call: Call) -> None:
        """Count a top-lane arrival's work, in the engine's unit once it is learnt, as its
        tenant's, within its share or not."""
        rates = self._prefill_rates()
        prefill_rate = sum(rates) / len(rates) if rates else None
        output_tokens = call.reserved_tokens - call.prompt_tokens
        work_s = self._work_s(call.prompt_tokens, output_tokens, prefill_rate)
        if work_s is not None:
            self._recent.asked(call.tenant.name, work_s, call.tenant.weight, self._clock.now())

    def asked_lately(self, tenant: str) -> float:
        """The engine seconds `tenant` asked lately per its weight (`RecentWork`)."""
        return self._recent.level(tenant, self._clock.now())


class RecentWork:
    """Each tenant's work asked, per its weight, fading by e every `horizon_s`."""

    def __init__(self, horizon_s: float) -> None:
        self._horizon_s = horizon_s
        self._asked: dict[str, tuple[float, float]] = {}
        """Per tenant: its faded work per weight and when it was last brought up to date."""

    def asked(self, flow: str, work_s: float, weight: float, now: float) -> None:
        self._asked[flow] = (self.level(flow, now) + work_s / weight, now)

    def level(self, flow: str, now: float) -> float:
        """`flow`'s work asked lately per weight: who has it least is furthest below its
        share."""
        found = self._asked.get(flow)
        if found is None:
            return 0.0
        work, at = found
        faded = work * math.exp(-(now - at) / self._horizon_s)
        if faded < work * FORGOTTEN:
            del self._asked[flow]
            return 0.0
        return faded
