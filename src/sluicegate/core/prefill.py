"""How many prompt tokens one deployment may be prefilling at once.

A continuous-batching engine prefills every prompt it is sent in the next engine steps,
together: twenty long prompts sent into an idle batch all get their first token when the
last of them is prefilled, seconds later, however empty the queue looked. The budget
holds the prompt tokens sent to a deployment and still waiting for their first token to
what it prefills within a part of the promise, its rate learnt from first tokens as
they come: tokens that reached their first token over the time any were waiting (a
busy period's throughput, so prompts sent together are measured together). Before
anything is measured it lets one request go at a time; one request alone always goes,
however long its prompt. A rate measured on some prompts is not trusted for many more:
the tokens waiting together may grow to twice the most that have reached a first token
together so far (a slow start), since an engine prefilling one prompt beside a few
decodes is faster per token than one prefilling twenty beside a full batch (measured:
one 2,600-token prompt at 18,800 tokens/s, then twelve sent together on that estimate
at 14,000, their first tokens 0.4 s past the estimate). And a request that already
waited is allowed only what its own promise has left, and is due by then: no prompt is
admitted that, prefilled with those waiting, would push it past that time (it was let
go on what it had left; a fresh prompt sent a moment later into the same engine step
would take it). A refusal says when the earliest due time passes, so that whoever
waits looks again then: a prompt past its due time holds nobody (it is late whatever
follows, and one that never gets its first token must not hold the others for long).

The budget is the deployment's, whichever replica sends to it: it lives in the limit
store beside the pools' slots and is decided with them (`Ask.prefill`), so replicas
sharing a store share one budget and one learnt rate (each replica's own would let N replicas send N
times what the engine prefills in time, and would learn from its own first tokens a
rate shared with the others'). This class is its arithmetic, kept by the in-memory
store; the Redis store's scripts do the same.

Only streamed requests are counted and held: a non-streamed answer's first token is not
seen, so its prefill cannot be timed.
"""

from __future__ import annotations

import math

HORIZON_S = 2.0
"""The learnt throughput is tokens over busy time, both summed with older measures
fading by e for each `HORIZON_S` of busy time since: a fade per busy time, not per
first token, since the first tokens of one engine step reach the gateway microseconds
apart, and a fade at each of them would weigh their step's time once but its tokens
in full (measured: ten first tokens 0.1 ms apart read 1.7x the true rate)."""
GROWTH = 2
"""How far beyond the most prompt tokens seen prefilled together the budget may reach."""


class PrefillBudget:
    def __init__(self, now_s: float) -> None:
        self._sent: dict[str, int] = {}
        """Prompt tokens of each request waiting for its first token."""
        self._due: dict[str, float] = {}
        """When those sent on what their own promise had left must have their first token."""
        self.pending = 0
        """Prompt tokens sent and not yet at their first token."""
        self._tokens = 0.0
        self._busy_s = 0.0
        """Decayed sums of prefilled tokens and the time any were waiting: their ratio is
        the learnt throughput."""
        self._since_s = now_s
        self.proven = 0
        """The most prompt tokens seen awaiting their first token together when one
        arrived: how far the learnt rate has been tried."""

    @property
    def tokens_per_s(self) -> float | None:
        """The learnt prefill throughput; None before the first measure."""
        if self._tokens <= 0 or self._busy_s <= 0:
            return None
        return self._tokens / self._busy_s

    def limit(self, within_s: float) -> float | None:
        """The prompt tokens that may wait for their first token together, for a request
        whose prompt must be prefilled within `within_s`; None while nothing is measured
        (one request at a time)."""
        rate = self.tokens_per_s
        if rate is None:
            return None
        return min(rate * within_s, GROWTH * self.proven)

    def admits(self, tokens: int, within_s: float, now_s: float) -> bool:
        if not self._sent:
            return True
        due_in_s = self.due_in_s(now_s)
        limit = self.limit(within_s if due_in_s is None else min(within_s, due_in_s))
        return limit is not None and self.pending + tokens <= limit

    def due_in_s(self, now_s: float) -> float | None:
        """How long until the earliest due time still to come; None when none is."""
        due_s = min((due for due in self._due.values() if due > now_s), default=None)
        return None if due_s is None else due_s - now_s

    def sent(self, key: str, tokens: int, due_s: float | None, now_s: float) -> None:
        """`key`'s prompt is counted from `now_s`, due by `due_s` if its promise sets one."""
        if not self._sent:
            self._since_s = now_s
        self._sent[key] = tokens
        if due_s is not None:
            self._due[key] = due_s
        self.pending += tokens

    def first_token(self, key: str, now_s: float) -> None:
        """`key`'s prompt is prefilled: learn from it, if it was counted."""
        tokens = self._sent.pop(key, None)
        if tokens is None:
            return
        self._due.pop(key, None)
        self.proven = max(self.proven, self.pending)
        busy_s = now_s - self._since_s
        if busy_s > 0:
            fade = math.exp(-busy_s / HORIZON_S)
            self._tokens *= fade
            self._busy_s = fade * self._busy_s + busy_s
            self._since_s = now_s
        self._tokens += tokens
        self.pending -= tokens

    def dropped(self, key: str) -> None:
        """`key` ended without a first token (failed, abandoned): no longer counted and
        nothing learnt from it; while others wait, the time it did stays in the busy
        period the next first token is measured over (the engine may have spent it)."""
        tokens = self._sent.pop(key, None)
        if tokens is not None:
            self._due.pop(key, None)
            self.pending -= tokens
