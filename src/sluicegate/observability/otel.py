"""OpenTelemetry spans of each request (`tracing.enabled`, with `sluicegate[otel]`).

Attribute names follow the GenAI semantic conventions where one fits (`gen_ai.*`), and
the gateway's own are `sluicegate.*`. A span never holds a prompt, an output or a key.
The request span continues the caller's W3C trace when it sent one; each attempt's span
is the parent the upstream is told (`traceparent`), so a backend that traces (vLLM)
joins the same trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sluicegate.core.call import Call
from sluicegate.core.ids import RequestContext, current
from sluicegate.core.types import Deployment, Endpoint, TracingPolicy
from sluicegate.observability.tracing import Spans

_OPERATIONS = {
    Endpoint.CHAT: "chat",
    Endpoint.COMPLETIONS: "text_completion",
    Endpoint.EMBEDDINGS: "embeddings",
}
"""gen_ai.operation.name of each route."""
_PROPAGATOR = TraceContextTextMapPropagator()


def provider(policy: TracingPolicy) -> TracerProvider:
    """A provider exporting over OTLP/HTTP to `policy.endpoint`, sampling new traces at
    `sample_ratio` and following the caller's decision for the rest."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    made = TracerProvider(
        resource=Resource.create({"service.name": policy.service_name}),
        sampler=ParentBased(TraceIdRatioBased(policy.sample_ratio)),
    )
    made.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=policy.endpoint)))
    return made


class OtelSpans(Spans):
    on = True

    def __init__(self, tracer_provider: trace.TracerProvider) -> None:
        self._tracer = tracer_provider.get_tracer("sluicegate")

    def request(self, endpoint: Endpoint) -> AbstractContextManager[Any]:
        operation = _OPERATIONS[endpoint]
        return self._tracer.start_as_current_span(
            f"{operation} sluicegate",
            context=_callers_context(),
            kind=SpanKind.SERVER,
            attributes={"gen_ai.operation.name": operation},
            record_exception=False,
        )

    def queue(self, call: Call, number: int) -> AbstractContextManager[Any]:
        return self._tracer.start_as_current_span(
            "queue wait",
            attributes={"sluicegate.lane": call.lane.name, "sluicegate.attempt": number},
            record_exception=False,
        )

    @contextmanager
    def attempt(self, call: Call, deployment: Deployment, number: int) -> Iterator[Any]:
        operation = _OPERATIONS[call.endpoint]
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": deployment.provider,
            "gen_ai.request.model": deployment.upstream_model,
            "sluicegate.deployment": deployment.name,
            "sluicegate.attempt": number,
        }
        with self._tracer.start_as_current_span(
            f"{operation} {deployment.upstream_model}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
        ) as span:
            told = _upstream_told(span)
            try:
                yield span
            except BaseException as err:
                _failed(span, err)
                raise
            finally:
                if told is not None:
                    current.reset(told)

    def stream(self) -> AbstractContextManager[Any]:
        return self._tracer.start_as_current_span("stream", record_exception=False)

    def resolved(self, span: Any, call: Call) -> None:
        span.set_attributes(
            {
                "gen_ai.request.model": call.model.name,
                "gen_ai.request.max_tokens": call.reserved_tokens - call.prompt_tokens,
                "sluicegate.lane": call.lane.name,
                "sluicegate.tenant": call.tenant.name,
                "sluicegate.stream": call.stream,
            }
        )

    def ended(
        self,
        span: Any,
        status: int,
        code: str | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        span.set_attribute("http.response.status_code", status)
        if prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
        if completion_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", completion_tokens)
        if code is not None:
            span.set_attribute("error.type", code)
            span.set_status(Status(StatusCode.ERROR, code))


def _callers_context() -> Any:
    """The caller's trace (its valid traceparent, as the edge kept it), else None: a new
    trace."""
    context = current.get()
    if context is None or context.traceparent is None:
        return None
    carrier = {"traceparent": context.traceparent}
    if context.tracestate is not None:
        carrier["tracestate"] = context.tracestate
    return _PROPAGATOR.extract(carrier)


def _upstream_told(span: trace.Span) -> Any:
    """Make the attempt's span the parent the upstream hears of; the token to undo it."""
    context = current.get()
    if context is None or not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    told = RequestContext(context.request_id, carrier.get("traceparent"), carrier.get("tracestate"))
    return current.set(told)


def _failed(span: trace.Span, err: BaseException) -> None:
    code = getattr(err, "code", None) or type(err).__name__
    span.set_attribute("error.type", code)
    span.set_status(Status(StatusCode.ERROR, code))
