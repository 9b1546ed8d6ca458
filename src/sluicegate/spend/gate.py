"""Spend on a request's path: its budgets reserved before any model call, each attempt's
cost counted as it ends, the budgets settled with the sum when the request ends.

Which attempts count: every one whose provider reported usage (its real usage); one
that was cut after its deployment started answering (the caller gone, a lost hedge, a
stream broken) without usage, as its prompt plus the stream events relayed, marked
estimated; not one the deployment refused or failed before answering (nothing billed).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from sluicegate.core.call import Call, Tally
from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Deployment, Settings
from sluicegate.scheduling.attempt import Attempt
from sluicegate.spend.book import SpendBook
from sluicegate.spend.budgets import Budgets
from sluicegate.spend.prices import Usage, clamped, estimate_nanos, most_per_token


class SpendGate:
    def __init__(self, settings: Settings, book: SpendBook, budgets: Budgets | None) -> None:
        self.book = book
        self.budgets = budgets
        self._rates = {name: most_per_token(model) for name, model in settings.models.items()}

    async def admit(self, call: Call, permits: AsyncExitStack, tally: Tally) -> None:
        """Reserve the request's estimate on its budgets (refused: `budget_exceeded`);
        the settlement is left on `permits`, which end after every attempt has. A
        request refused here used no tokens: its token quotas, the aggregate's among
        them, get their whole reservation back (`tally`)."""
        budgets = self.budgets
        bill = call.bill
        if budgets is None or bill is None:
            return
        applying = budgets.applying(call.tenant.name, call.model.name)
        if not applying:
            return
        rates = self._rates[call.model.name]
        nanos = estimate_nanos(rates, call.prompt_tokens, call.reserved_tokens - call.prompt_tokens)
        try:
            hold = await budgets.reserve(applying, nanos)
        except GatewayError:
            tally.used_tokens = 0
            raise

        async def settle() -> None:
            bill.late = lambda nanos: budgets.owe(hold.lines, nanos)
            await budgets.settle(hold, applying, bill.nanos)

        permits.push_async_callback(settle)

    def attempt_ended(
        self, attempt: Attempt, deployment: Deployment, error: BaseException | None
    ) -> None:
        call = attempt.call
        bill = call.bill
        if bill is None:
            return
        usage = billed(attempt, error)
        if usage is None:
            return
        nanos = self.book.charge(bill, call.tenant.name, call.model.name, deployment, usage)
        if bill.late is not None:
            bill.late(nanos)


def billed(attempt: Attempt, error: BaseException | None) -> Usage | None:
    """What the provider billed `attempt`, as it reported or as estimated; None when it
    failed before answering."""
    prompt = attempt.call.prompt_tokens
    used = attempt.used_tokens
    if used is not None:
        # An upstream may claim more output than the request allowed: it is held to it.
        allowed = attempt.call.reserved_tokens - prompt
        output = min(attempt.produced() or 0, allowed)
        return clamped(used - (attempt.produced() or 0), attempt.cached_tokens or 0, output)
    if isinstance(error, GatewayError) and not attempt.relayed:
        return None
    return clamped(prompt, 0, attempt.relayed, estimated=True)
