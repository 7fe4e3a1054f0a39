"""A loopback OTLP/HTTP trace receiver for tests: POST /v1/traces, protobuf, as a collector.

It runs an aiohttp server on 127.0.0.1 on its own thread and event loop (the SDK exports from
its own thread; a gateway under test may run in another process), decodes each request with
opentelemetry-proto's ``ExportTraceServiceRequest`` and keeps the raw bodies too, so a test can
look for text that must never be exported.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {item.key: _value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int  # opentelemetry.proto Span.SpanKind: 1 internal, 2 server, 3 client
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    resource: dict[str, Any] = field(default_factory=dict)


class OtlpReceiver:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        """The value of OTEL_EXPORTER_OTLP_ENDPOINT (the SDK appends /v1/traces)."""
        return f"http://127.0.0.1:{self.port}"

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest.FromString(body)
        received = []
        for resource_spans in message.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    events = [
                        (event.name, event.time_unix_nano, _attributes(event.attributes))
                        for event in span.events
                    ]
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            status_code=span.status.code,
                            attributes=_attributes(span.attributes),
                            events=events,
                            resource=resource,
                        )
                    )
        with self._lock:
            self.bodies.append(body)
            self.spans.extend(received)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def clear(self) -> None:
        with self._lock:
            self.bodies.clear()
            self.spans.clear()

    def spans_now(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for_spans(self, count: int, timeout_s: float = 10.0) -> list[ReceivedSpan]:
        """At least ``count`` spans (blocking; call it off the event loop)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.02)
        with self._lock:
            raise AssertionError(f"expected {count} spans, received {len(self.spans)}")
