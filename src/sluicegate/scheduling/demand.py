"""What does a token cost the engine? Learnt from the backend as it serves.

Work is counted in the engine's own unit: seconds of its steps. Each step of a
continuous batch decodes a token for every running sequence and prefills some prompt
tokens, and takes about a decode part plus a price per prompt token. A stream that
ended tells both: over its span after its first token it took one step per token, and
the dispatcher counted the prompt tokens that got their first token on its deployment
meanwhile. Per sequence and step, its time is the decode cost of an output token plus
the prefill price times the prompt tokens per sequence and step: a line through the
streams, whose slope is the price and whose intercept the decode cost. The prefill
budget's rate (prompt tokens over the time any waited) is the effective price, its busy
time holding every decode step's part, several times the marginal one: read as the
price, it would judge the tenants of long prompts far dearer than they are. It stays
the bound (the marginal price is no more) and the price until the streams tell the
slope. A fixed ratio (the VTC's 1:2) is wrong by an order of magnitude on a batch that
decodes a token for the time it prefills twenty; a ratio fitted to one backend would be
wrong on the next.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sluicegate.core.clock import Clock
from sluicegate.scheduling.attempt import Attempt, Target
from sluicegate.scheduling.plugin import Quiet

SMOOTHING = 0.1
"""Weight of the newest stream in the sums the prices are read from."""
SPREAD = 0.25
"""How much the streams' prompt tokens per step must vary (standard deviation over
mean) before a slope is read: with all alike, the slope is noise."""
SAMPLES = 10
"""Streams seen before a slope is read."""


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


class Learner(Quiet):
    """Learns the engine's unit from every stream that ends (`EngineUnit`). It listens
    only beside a prefill budget: without one no prompt is counted, no price is learnt,
    and a work estimate needs one."""

    def __init__(
        self,
        targets: int,
        clock: Clock,
        in_flight: Callable[[], int],
        prefill_rate: Callable[[Target], float | None],
        prompts_meanwhile: Callable[[Attempt, Target], int | None],
        listening: bool = True,
    ) -> None:
        self.unit = EngineUnit()
        self.listening = listening
        self._targets = targets
        self._clock = clock
        self._in_flight = in_flight
        self._prefill_rate = prefill_rate
        self._prompts_meanwhile = prompts_meanwhile

    def ended(self, attempt: Attempt) -> None:
        target, first_s, tokens = attempt.target, attempt.first_byte_s, attempt.completion_tokens
        assert target is not None
        if not attempt.call.stream or first_s is None or not tokens:
            return
        prompts = self._prompts_meanwhile(attempt, target)
        if prompts is None:
            return
        rate = self._prefill_rate(target)
        self.unit.streamed(
            tokens,
            self._clock.now() - first_s,
            prompts,
            math.ceil(self._in_flight() / self._targets),
            1.0 / rate if rate else None,
        )
