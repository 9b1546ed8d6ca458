"""What each tenant asked of the engine lately, in the engine's own unit of work.

Requests within their tenant's share all go before the others, but on a full batch they
still wait for completions in some order among themselves, and the order decides who
waits. By requests in flight, a burst's first requests (its tenant holds nothing yet)
go before a steady light tenant's next one (it holds one), and a steady tenant asking
its share waits behind every burst. By work asked lately per weight, the lightest
tenant goes first: the one furthest below its share of the engine's time.

The unit is the engine's, learnt from the backend as it serves. Each step of a
continuous batch decodes a token for every running sequence and prefills some prompt
tokens, and takes about a decode part plus a price per prompt token. A stream that
ended tells both: over its span after its first token it took one step per token, and
the dispatcher counted the prompt tokens that got their first token on its deployment
meanwhile. Per sequence and step, its time is the decode cost of an output token plus
the prefill price times the prompt tokens per sequence and step: a line through the
streams, whose slope is the price and whose intercept the decode cost. The prefill
budget's rate (prompt tokens over the time any waited) is the effective one, its busy
time holding every decode step's part; read as the price, it made a prompt token cost
two to seven times what the simulator's engine spends on one (family v2: a tenant of
1,239-token prompts read 8-10 times as dear a slot as one of decode-only answers, the
family's unit about 1.9), so the short prompts' tenants were judged beyond their
share. It stays the bound (the marginal price is no more) and the price until the
streams tell the slope. A fixed ratio (the VTC's 1:2) is wrong by an order of magnitude
on a batch that decodes a token for the time it prefills twenty; a ratio fitted to one
backend would be wrong on the next.
"""

from __future__ import annotations

import math

HORIZON_S = 2.0
"""Over how long a tenant's asked work is counted when the top lane makes no promise;
with one, the promise: a tenant is judged over the time its request may be kept."""
SMOOTHING = 0.1
"""Weight of the newest stream in the sums the prices are read from."""
SPREAD = 0.25
"""How much the streams' prompt tokens per step must vary (standard deviation over
mean) before a slope is read: with all alike, the slope is noise."""
SAMPLES = 10
"""Streams seen before a slope is read."""
FORGOTTEN = 1e-6
"""Work below this fraction of its last value is forgotten with its tenant: the map walks
only the tenants active lately."""


class EngineUnit:
    """Seconds of the engine an output token and a prompt token cost."""

    def __init__(self) -> None:
        self.decode_s_per_token: float | None = None
        self.prefill_s_per_token: float | None = None
        """The marginal price, once the streams have told it, kept while they tell no
        slope (always within the budget's price); None before."""
        self._sums: list[float] | None = None
        """Smoothed means of x, y, x^2 and x*y over the streams (x: prompt tokens per
        sequence and step, y: seconds per sequence and step)."""
        self._seen = 0

    def streamed(
        self, tokens: int, span_s: float, prompts: int, sequences: int, bound_s: float | None
    ) -> None:
        """A stream produced `tokens` over `span_s` after its first, in a batch of about
        `sequences`, while the engine prefilled `prompts` prompt tokens of others;
        `bound_s` is the effective price a token (the budget's), None before one."""
        if tokens < 2 or span_s <= 0 or sequences < 1:
            return
        per = (tokens - 1) * sequences
        x, y = prompts / per, span_s / per
        sums = self._sums
        if sums is None:
            sums = self._sums = [x, y, x * x, x * y]
        else:
            for i, value in enumerate((x, y, x * x, x * y)):
                sums[i] += SMOOTHING * (value - sums[i])
        self._seen += 1
        mean_x, mean_y, mean_xx, mean_xy = sums
        spread = mean_xx - mean_x * mean_x
        price = self.prefill_s_per_token
        if self._seen >= SAMPLES and spread > (SPREAD * mean_x) ** 2:
            price = max(0.0, (mean_xy - mean_x * mean_y) / spread)
        if price is not None and bound_s is not None:
            price = min(price, bound_s)
        charged = bound_s if price is None else price
        decode = mean_y - (charged or 0.0) * mean_x
        if decode <= 0:
            return
        self.prefill_s_per_token, self.decode_s_per_token = price, decode

    def work_s(
        self, prompt_tokens: int, output_tokens: int, prefill_tokens_per_s: float | None
    ) -> float | None:
        """The engine seconds one request asks; None before both costs are known. A
        prompt token at the learnt price, else at the budget's effective rate."""
        decode, price = self.decode_s_per_token, self.prefill_s_per_token
        if price is None and prefill_tokens_per_s:
            price = 1.0 / prefill_tokens_per_s
        if decode is None or price is None:
            return None
        return prompt_tokens * price + output_tokens * decode


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
