"""Where the pipeline marks a request's spans: the request, each wait for a turn, each
attempt and the answer's stream. `Spans` itself records nothing, so with tracing off a
request pays a shared null context per mark and imports no tracing library;
`observability.otel.OtelSpans` records them with OpenTelemetry (`sluicegate[otel]`).

Each mark is a context manager entered in the task that does the work, so a span's
children are the marks entered inside it, hedged attempts included (their tasks copy
the context they were made in).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from sluicegate.core.call import Call
from sluicegate.core.types import Deployment, Endpoint

NO_SPAN: AbstractContextManager[None] = nullcontext()


class Spans:
    """Tracing off: every mark is `NO_SPAN` and every note does nothing."""

    on = False
    """Whether notes are worth the work of gathering what they say."""

    def request(self, endpoint: Endpoint) -> AbstractContextManager[Any]:
        return NO_SPAN

    def queue(self, call: Call, number: int) -> AbstractContextManager[Any]:
        return NO_SPAN

    def attempt(
        self, call: Call, deployment: Deployment, number: int
    ) -> AbstractContextManager[Any]:
        """Also what the upstream is told (its traceparent), while it is entered."""
        return NO_SPAN

    def stream(self) -> AbstractContextManager[Any]:
        return NO_SPAN

    def resolved(self, span: Any, call: Call) -> None:
        """The request's model, lane and token budget, once they are known."""

    def ended(
        self,
        span: Any,
        status: int,
        code: str | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        """How the request ended."""
