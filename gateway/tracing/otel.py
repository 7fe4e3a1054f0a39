"""Tracing on: OpenTelemetry SDK spans, exported by a BatchSpanProcessor over OTLP/HTTP.

Imported only when tracing is enabled (the ``otel`` extra). Ending a span only queues it; the
processor's own thread batches and exports, so the event loop never waits on the collector,
and a collector that is down costs dropped spans (the SDK's bounded queue), never latency.
The provider is this object's own (no global tracer provider is set), so two apps in one
process, or tests, never share one. Parents are passed explicitly, never through the SDK's
context variables, so a stream's spans end correctly from the response generator.

W3C trace context only: ``traceparent`` (and ``tracestate``) are read from the client's
request and written into each upstream try's headers; other propagators (``baggage``) are
not used, so nothing else a client sends is forwarded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, MutableMapping
from importlib import metadata
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.tracing.config import TracingConfig
from gateway.tracing.genai import (
    INPUT_MESSAGES,
    OPERATION_NAME,
    PROVIDER_NAME,
    REQUEST_MODEL,
    input_messages,
    operation_of,
    request_attributes,
)
from gateway.tracing.spans import EnginePhases
from gateway.tracing.summary import ResponseSummary

SERVICE = "switchyard"
DISTRIBUTION = "switchyard-gateway"  # the PyPI name (pyproject.toml): "switchyard" is taken


def _resource() -> Resource:
    resource = Resource.create({SERVICE_VERSION: _version()})  # reads OTEL_SERVICE_NAME etc.
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    return resource


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _error_type(error: BaseException) -> str:
    return type(error).__name__


class OtelStage:
    __slots__ = ("_context", "_name", "_span", "_tracer")

    def __init__(self, tracer: Any, name: str, context: Context) -> None:
        self._tracer = tracer
        self._name = name
        self._context = context
        self._span: Span | None = None

    def __enter__(self) -> OtelStage:
        self._span = self._tracer.start_span(self._name, context=self._context)
        return self

    def set(self, name: str, value: Any) -> None:
        if self._span is not None:
            self._span.set_attribute(name, value)

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        span = self._span
        if span is None:
            return
        if error is not None:  # the type only: messages may quote input or upstream text
            span.set_attribute("error.type", _error_type(error))
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class OtelAttempt:
    __slots__ = ("_ended", "_propagator", "_span")

    def __init__(self, span: Span, propagator: TraceContextTextMapPropagator) -> None:
        self._span = span
        self._propagator = propagator
        self._ended = False

    def inject(self, headers: MutableMapping[str, str]) -> None:
        self._propagator.inject(headers, context=set_span_in_context(self._span))

    def engine_phases(self, phases: EnginePhases) -> None:
        offset_ns = time.time_ns() - time.monotonic_ns()  # engine clock -> wall clock

        def at(moment: float) -> int:
            return int(moment * 1e9) + offset_ns

        marks = [
            ("engine.queue", phases.queued_at, phases.scheduled_at, {}),
            ("engine.prefill", phases.scheduled_at, phases.first_token_at, {}),
            ("engine.decode", phases.first_token_at, phases.finished_at, {}),
        ]
        if phases.prompt_tokens is not None:
            marks[1][3]["gen_ai.usage.input_tokens"] = phases.prompt_tokens
        if phases.output_tokens is not None:
            marks[2][3]["gen_ai.usage.output_tokens"] = phases.output_tokens
        for name, began, ended, attributes in marks:
            if began is None:
                continue
            if ended is not None:
                attributes["duration_s"] = max(ended - began, 0.0)
            self._span.add_event(name, attributes, timestamp=at(began))

    def end(
        self, outcome: str, *, status: int | None = None, error_type: str | None = None
    ) -> None:
        if self._ended:
            return
        self._ended = True
        span = self._span
        span.set_attribute("switchyard.attempt.outcome", outcome)
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if outcome != "ok":
            span.set_attribute("error.type", error_type or outcome)
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class OtelRequest:
    __slots__ = (
        "_attributes",
        "_capture",
        "_context",
        "_ended",
        "_operation",
        "_propagator",
        "_span",
        "_summary",
        "_tracer",
    )

    def __init__(
        self,
        tracer: Any,
        propagator: TraceContextTextMapPropagator,
        span: Span,
        route: str,
        capture: bool,
    ) -> None:
        self._tracer = tracer
        self._propagator = propagator
        self._span = span
        self._context = set_span_in_context(span)
        self._capture = capture
        self._operation = operation_of(route)
        self._attributes: dict[str, Any] = {OPERATION_NAME: self._operation}
        self._summary: ResponseSummary | None = None
        self._ended = False

    def stage(self, name: str) -> OtelStage:
        return OtelStage(self._tracer, name, self._context)

    def request(self, route: str, body: Mapping[str, Any]) -> None:
        self._attributes = request_attributes(route, body)
        self._span.set_attributes(self._attributes)
        model = self._attributes.get(REQUEST_MODEL)
        if model:
            self._span.update_name(f"{self._operation} {model}")
        if self._capture:
            messages = input_messages(body)
            if messages is not None:
                self._span.set_attribute(INPUT_MESSAGES, messages)

    def set(self, name: str, value: Any) -> None:
        self._span.set_attribute(name, value)

    def attempt(
        self, *, number: int, provider: str, model: str, upstream_model: str, local: bool = False
    ) -> OtelAttempt:
        attributes = {
            **self._attributes,
            PROVIDER_NAME: provider,
            REQUEST_MODEL: upstream_model,
            "switchyard.model": model,
            "switchyard.attempt": number,
        }
        span = self._tracer.start_span(
            f"{self._operation} {upstream_model}",
            context=self._context,
            kind=SpanKind.INTERNAL if local else SpanKind.CLIENT,
            attributes=attributes,
        )
        return OtelAttempt(span, self._propagator)

    def _summary_of(self) -> ResponseSummary:
        if self._summary is None:
            self._summary = ResponseSummary(self._capture)
        return self._summary

    def observe_response(self, data: Any) -> None:
        self._summary_of().observe_response(data)

    def observe_chunk(self, chunk: Any) -> None:
        self._summary_of().observe_chunk(chunk)

    def end(self, status: int, *, error_type: str | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        span = self._span
        span.set_attribute("http.response.status_code", status)
        if self._summary is not None:
            span.set_attributes(self._summary.attributes())
        if status >= 400:
            span.set_attribute("error.type", error_type or str(status))
        if status >= 500:  # a client's mistake is not the server span's error
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class OtelTracing:
    """Tracing on. ``exporter`` replaces the OTLP/HTTP exporter (the benchmark's null one)."""

    enabled = True

    def __init__(self, config: TracingConfig, *, exporter: SpanExporter | None = None) -> None:
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()  # endpoint, headers, timeout: from OTEL_* variables
        self.reason = config.reason
        self._capture = config.capture_prompts
        self._provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("gateway.tracing", _version())
        self._propagator = TraceContextTextMapPropagator()

    def start_request(
        self, *, route: str, method: str, path: str, headers: Mapping[str, str]
    ) -> OtelRequest:
        parent = self._propagator.extract(headers)  # an invalid traceparent: a new trace
        span = self._tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": path,
                "url.path": path,
                "switchyard.route": route,
            },
        )
        return OtelRequest(self._tracer, self._propagator, span, route, self._capture)

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        """Export what is queued now (blocking: tests and shutdown only)."""
        return self._provider.force_flush(timeout_ms)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._provider.shutdown)
