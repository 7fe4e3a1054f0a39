"""What tracing costs a request's hot path: ``python -m bench.tracing``.

Times (timeit, best of ``--repeat``) one request's tracing calls, as the pipeline makes them
for a streamed chat completion (start, three stages, request attributes, one upstream try with
header injection, ``--chunks`` observed chunks, end), in three ways:

* ``none``: the same function body with every tracing call removed (the floor);
* ``off``: the calls against ``NoTracing`` (tracing not configured);
* ``on``: the calls against the OpenTelemetry SDK, spans batched to an exporter that drops them
  (the SDK's own cost, without the network).

Prints nanoseconds per request and ``off - none``, the price of tracing being possible.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

from gateway.tracing.config import TracingConfig
from gateway.tracing.spans import NoTracing, Tracing

BODY = {
    "model": "fast",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
    "max_tokens": 16,
    "stream": True,
}
CHUNK = {"id": "c1", "model": "fast", "choices": [{"index": 0, "delta": {"content": "x"}}]}
HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


def traced(tracing: Tracing, chunks: int) -> Callable[[], None]:
    def request() -> None:
        headers: dict[str, str] = {}
        trace = tracing.start_request(
            route="chat.completions", method="POST", path="/v1/chat/completions", headers=HEADERS
        )
        with trace.stage("authenticate"):
            pass
        trace.request("chat.completions", BODY)
        with trace.stage("limits"):
            pass
        attempt = trace.attempt(number=1, provider="p", model="fast", upstream_model="fast")
        attempt.inject(headers)
        for _ in range(chunks):
            trace.observe_chunk(CHUNK)
        attempt.end("ok", status=200)
        with trace.stage("usage_record"):
            pass
        trace.end(200)

    return request


def untraced(chunks: int) -> Callable[[], None]:
    def request() -> None:
        headers: dict[str, str] = {}
        for _ in range(chunks):
            pass
        del headers

    return request


def _null_otel() -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from gateway.tracing.otel import OtelTracing

    class DropAll(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    config = TracingConfig(enabled=True, reason="benchmark")
    return OtelTracing(config, exporter=DropAll())


def _best_ns(function: Callable[[], None], number: int, repeat: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=repeat)) / number * 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000, help="requests per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings; the best is kept")
    parser.add_argument("--chunks", type=int, default=16, help="stream chunks per request")
    args = parser.parse_args(argv)
    runs: dict[str, Callable[[], None]] = {
        "none": untraced(args.chunks),
        "off": traced(NoTracing(), args.chunks),
    }
    on = None
    try:
        on = _null_otel()
        runs["on"] = traced(on, args.chunks)
    except ImportError:
        print("on: the otel extra is not installed")
    results = {}
    for name, function in runs.items():
        number = args.number if name != "on" else max(args.number // 10, 100)
        results[name] = _best_ns(function, number, args.repeat)
        print(f"{name:>5}: {results[name]:10.0f} ns/request")
    print(f"off - none: {results['off'] - results['none']:.0f} ns/request")
    if on is not None:
        on._provider.shutdown()


if __name__ == "__main__":
    main()
