"""OpenTelemetry spans of a request, read from the SDK's in-memory exporter: the request
span continues the caller's trace and holds a queue wait and an attempt per try and the
stream; GenAI attribute names; no prompt anywhere; the upstream told the attempt's span."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluicegate.app import tracing
from sluicegate.core.ids import RequestContext, current
from sluicegate.core.types import TracingPolicy
from sluicegate.observability.otel import OtelSpans
from tests.unit.test_pipeline import config, driven, running

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
SECRET = "a-prompt-no-span-may-hold"


async def test_a_retried_stream_makes_a_tree_of_spans_under_the_callers_trace():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    raw = config({"name": "a"}, {"name": "b"}, route={"retry": {"max_attempts": 2, "base_s": 0}})
    async with running(raw, {"a": "fail"}) as h:
        h.runtime.pipeline._spans = OtelSpans(provider)
        told: list[RequestContext | None] = []
        original = h.providers["b"].open

        def open_b(*args, **kwargs):
            told.append(current.get())
            return original(*args, **kwargs)

        h.providers["b"].open = open_b  # type: ignore[method-assign]
        token = current.set(RequestContext("req-traced", PARENT))
        try:
            inbound = h.inbound(stream=True, messages=[{"role": "user", "content": SECRET}])

            async def ask() -> list[bytes]:
                async with h.runtime.pipeline.run(inbound) as answer:
                    return [chunk async for chunk in answer.chunks()]

            assert await driven(h.clock, asyncio.ensure_future(ask()))
        finally:
            current.reset(token)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    names = sorted(span.name for span in exporter.get_finished_spans())
    assert names == ["chat m", "chat m", "chat sluicegate", "queue wait", "queue wait", "stream"]
    request = spans["chat sluicegate"]
    assert f"{request.context.trace_id:032x}" == TRACE
    assert f"{request.parent.span_id:016x}" == "00f067aa0ba902b7"
    children = [s for s in exporter.get_finished_spans() if s is not request]
    assert all(s.parent.span_id == request.context.span_id for s in children)
    attempts = sorted(
        (s for s in children if s.name == "chat m"),
        key=lambda s: s.attributes["sluicegate.attempt"],
    )
    assert [s.attributes["sluicegate.deployment"] for s in attempts] == ["a", "b"]
    assert attempts[0].attributes["error.type"] == "upstream_timeout"
    assert "error.type" not in attempts[1].attributes
    assert attempts[1].attributes["gen_ai.provider.name"] == "openai"
    assert attempts[1].attributes["gen_ai.request.model"] == "m"
    assert request.attributes["gen_ai.operation.name"] == "chat"
    assert request.attributes["gen_ai.request.model"] == "chat"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["gen_ai.usage.output_tokens"] >= 0
    (heard,) = told
    assert heard is not None
    assert heard.request_id == "req-traced"
    assert heard.traceparent == f"00-{TRACE}-{attempts[1].context.span_id:016x}-01"
    for span in exporter.get_finished_spans():
        assert SECRET not in str(dict(span.attributes or {}))


def test_tracing_on_exports_over_otlp_and_flushes_at_the_end():
    spans, flush = tracing(TracingPolicy(enabled=True, endpoint="http://127.0.0.1:9/v1/traces"))
    assert isinstance(spans, OtelSpans)
    assert flush is not None
    flush()


def test_tracing_off_loads_no_tracing_code():
    """(redis-py itself imports OpenTelemetry when it is installed; ours stays out.)"""
    code = (
        "import sys; from sluicegate.app import tracing; from sluicegate.core.types import "
        "TracingPolicy; spans, flush = tracing(TracingPolicy()); assert flush is None; "
        "print(type(spans).__name__, 'sluicegate.observability.otel' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["Spans", "False"]
