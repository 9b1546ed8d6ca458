"""What each tenant asked of the engine lately, in the engine's own unit of work.

Requests within their tenant's share all go before the others, but on a full batch they
still wait for completions in some order among themselves, and the order decides who
waits. By requests in flight, a burst's first requests (its tenant holds nothing yet)
go before a steady light tenant's next one (it holds one), and a steady tenant asking
its share waits behind every burst. By work asked lately per weight, the lightest
tenant goes first: the one furthest below its share of the engine's time.

The unit is the engine's, learnt from the backend as it serves: a prompt token costs
the time the deployment takes to prefill one (the prefill budget's measured rate),
an output token the decode step it comes in, shared among the sequences in that step:
a stream's span less what the engine prefilled meanwhile (the dispatcher's count), or
long prompts prefilled between the steps would be charged again to every token.
A fixed ratio (the VTC's 1:2) is wrong by an order of magnitude on a batch that
decodes a token for the time it prefills twenty; a ratio fitted to one backend would
be wrong on the next.
"""

from __future__ import annotations

import math

HORIZON_S = 2.0
"""Over how long a tenant's asked work is counted when the top lane makes no promise;
with one, the promise: a tenant is judged over the time its request may be kept."""
SMOOTHING = 0.1
"""Weight of the newest decode measure in the learnt cost of an output token."""
FORGOTTEN = 1e-6
"""Work below this fraction of its last value is forgotten with its tenant: the map walks
only the tenants active lately."""


class EngineUnit:
    """Seconds of the engine an output token costs; prompt tokens are priced by the caller
    from the prefill rate it measures."""

    def __init__(self) -> None:
        self.decode_s_per_token: float | None = None

    def decoded(self, tokens: int, span_s: float, sequences: int) -> None:
        """A stream produced `tokens` over `span_s` of decode steps after its first one
        (its span less others' prefills), shared by about `sequences` sequences: each
        token after the first took one step."""
        if tokens < 2 or span_s <= 0 or sequences < 1:
            return
        cost = span_s / (tokens - 1) / sequences
        known = self.decode_s_per_token
        self.decode_s_per_token = cost if known is None else known + SMOOTHING * (cost - known)

    def work_s(
        self, prompt_tokens: int, output_tokens: int, prefill_tokens_per_s: float | None
    ) -> float | None:
        """The engine seconds one request asks; None before both costs are known."""
        decode = self.decode_s_per_token
        if decode is None or not prefill_tokens_per_s:
            return None
        return prompt_tokens / prefill_tokens_per_s + output_tokens * decode


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
