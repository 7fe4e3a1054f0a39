"""Spans reach a loopback OTLP/HTTP receiver with the request's structure and GenAI attributes:
the request span (child of the client's traceparent), stages, one span per upstream try (the
failed one and the fallback), engine phases as events; each try's traceparent reaches the
upstream; prompt text only when capture is on."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson
import pytest
from fake_upstream import FakeUpstream, ThreadedFakeUpstream
from otlp_receiver import OtlpReceiver, ReceivedSpan
from tracing_support import MakeTracing, flushed

from gateway.tracing import EnginePhases, RequestTrace, Tracing

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SECRET_PROMPT = "the launch code is 0451"
SERVER, CLIENT, INTERNAL = 2, 3, 1


@pytest.fixture(scope="module")
def upstream() -> Any:
    with ThreadedFakeUpstream() as fake:
        yield fake


def chat_body(stream: bool = False) -> dict[str, Any]:
    return {
        "model": "auto",
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": SECRET_PROMPT},
        ],
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 7,
        "seed": 11,
        "stop": ["\n\n"],
        "stream": stream,
    }


async def call_upstream(
    http: aiohttp.ClientSession,
    upstream: FakeUpstream,
    trace: RequestTrace,
    number: int,
    model: str,
    body: dict[str, Any],
) -> tuple[int, Any]:
    """One try, as a provider makes it: its traceparent in the headers, its span ended (a
    stream asks for usage, as the gateway always does upstream)."""
    if body.get("stream"):
        body = {**body, "stream_options": {"include_usage": True}}
    attempt = trace.attempt(
        number=number, provider=f"p{number}", model="fast", upstream_model=model
    )
    headers = {"authorization": "Bearer upstream-secret"}
    attempt.inject(headers)
    async with http.post(
        f"{upstream.base_url}/chat/completions", json={**body, "model": model}, headers=headers
    ) as response:
        if response.status != 200:
            attempt.end("failed", status=response.status, error_type=str(response.status))
            return response.status, None
        if body.get("stream"):
            chunks = []
            async for line in response.content:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    chunks.append(orjson.loads(line[6:]))
            attempt.end("ok", status=200)
            return 200, chunks
        data = await response.json()
        attempt.end("ok", status=200)
        return 200, data


async def serve(
    tracing: Tracing, upstream: FakeUpstream, headers: dict[str, str], stream: bool = False
) -> None:
    """The pipeline's calls for one request whose first candidate fails with a 500."""
    trace = tracing.start_request(
        route="chat.completions", method="POST", path="/v1/chat/completions", headers=headers
    )
    with trace.stage("authenticate"):
        pass
    body = chat_body(stream)
    trace.request("chat.completions", body)
    trace.set("switchyard.task", "chat")
    with trace.stage("limits") as stage:
        stage.set("switchyard.limits.rpm_remaining", 59)
    async with aiohttp.ClientSession() as http:
        status, _ = await call_upstream(http, upstream, trace, 1, "fail-500-model", body)
        assert status == 500
        status, answer = await call_upstream(http, upstream, trace, 2, "fast-v2", body)
    if stream:
        for chunk in answer:
            trace.observe_chunk(chunk)
    else:
        trace.observe_response(answer)
    with trace.stage("usage_record"):
        pass
    trace.end(200)


def by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


@pytest.mark.parametrize("stream", [False, True])
async def test_spans_arrive_with_structure_and_genai_attributes(
    make_tracing: MakeTracing, receiver: OtlpReceiver, upstream: FakeUpstream, stream: bool
) -> None:
    tracing = make_tracing(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_SERVICE_NAME="gw-under-test"
    )
    assert tracing.enabled
    upstream.requests.clear()
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    await serve(tracing, upstream, {"traceparent": traceparent}, stream=stream)
    await flushed(tracing)
    spans = receiver.wait_for_spans(6)
    assert len(spans) == 6
    named = by_name(spans)
    (root,) = named["chat auto"]
    assert {s.trace_id for s in spans} == {CLIENT_TRACE}  # the client's trace, honoured
    assert root.parent_span_id == CLIENT_SPAN and root.kind == SERVER
    for stage in ("authenticate", "limits", "usage_record"):
        (span,) = named[stage]
        assert span.parent_span_id == root.span_id and span.kind == INTERNAL
    assert named["limits"][0].attributes["switchyard.limits.rpm_remaining"] == 59
    (failed,) = named["chat fail-500-model"]
    (served,) = named["chat fast-v2"]
    for number, attempt in enumerate((failed, served), start=1):
        assert attempt.parent_span_id == root.span_id and attempt.kind == CLIENT
        assert attempt.attributes["switchyard.attempt"] == number
        assert attempt.attributes["gen_ai.provider.name"] == f"p{number}"
        assert attempt.attributes["gen_ai.operation.name"] == "chat"
        assert attempt.attributes["switchyard.model"] == "fast"
        assert attempt.attributes["gen_ai.request.temperature"] == 0.2
    assert failed.attributes["switchyard.attempt.outcome"] == "failed"
    assert failed.attributes["error.type"] == "500" and failed.status_code == 2
    assert served.attributes["switchyard.attempt.outcome"] == "ok" and served.status_code == 0
    assert failed.end_ns <= served.start_ns  # the fallback came after the failure
    attributes = root.attributes
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "auto",
        "gen_ai.request.max_tokens": 7,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.seed": 11,
        "gen_ai.request.stop_sequences": ["\n\n"],
        "gen_ai.request.stream": stream,
        "gen_ai.response.model": "fast-v2",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 7,
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "switchyard.task": "chat",
    }
    assert {name: attributes.get(name) for name in expected} == expected
    assert attributes["gen_ai.response.id"]
    assert root.resource["service.name"] == "gw-under-test"
    # Each try carried its own span as the upstream request's parent.
    seen = [request.headers.get("traceparent") for request in list(upstream.requests)[-2:]]
    assert seen == [f"00-{CLIENT_TRACE}-{span.span_id}-01" for span in (failed, served)]
    # No prompt text and no credential anywhere in what was exported.
    for body in receiver.bodies:
        assert SECRET_PROMPT.encode() not in body and b"upstream-secret" not in body
        assert b"Answer briefly" not in body
    assert "gen_ai.input.messages" not in attributes
    assert "gen_ai.output.messages" not in attributes


async def test_prompt_capture_exports_messages_when_turned_on(
    make_tracing: MakeTracing, receiver: OtlpReceiver, upstream: FakeUpstream
) -> None:
    tracing = make_tracing(capture_prompts=True, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
    await serve(tracing, upstream, {}, stream=True)
    await flushed(tracing)
    (root,) = by_name(receiver.wait_for_spans(6))["chat auto"]
    assert root.parent_span_id == ""  # no traceparent: a new trace
    messages = orjson.loads(root.attributes["gen_ai.input.messages"])
    assert messages == [
        {"role": "system", "parts": [{"type": "text", "content": "Answer briefly."}]},
        {"role": "user", "parts": [{"type": "text", "content": SECRET_PROMPT}]},
    ]
    (output,) = orjson.loads(root.attributes["gen_ai.output.messages"])
    assert output["role"] == "assistant" and output["finish_reason"] == "stop"
    assert output["parts"][0]["content"].startswith("Hello")


async def test_an_unsampled_traceparent_is_honoured(
    make_tracing: MakeTracing, receiver: OtlpReceiver, upstream: FakeUpstream
) -> None:
    tracing = make_tracing(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
    upstream.requests.clear()
    await serve(tracing, upstream, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"})
    await serve(tracing, upstream, {"traceparent": "00-garbage-00f067aa0ba902b7-01"})
    await flushed(tracing)
    spans = receiver.wait_for_spans(6)
    assert len(spans) == 6  # the second request's only: the caller did not sample the first
    assert CLIENT_TRACE not in {span.trace_id for span in spans}
    (root,) = by_name(spans)["chat auto"]
    assert root.parent_span_id == ""  # a malformed traceparent starts a new trace
    # The unsampled trace still propagates upstream, with its flag.
    first = list(upstream.requests)[-4].headers["traceparent"]
    assert first.startswith(f"00-{CLIENT_TRACE}-") and first.endswith("-00")


async def test_engine_phases_are_span_events(
    make_tracing: MakeTracing, receiver: OtlpReceiver
) -> None:
    tracing = make_tracing(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
    trace = tracing.start_request(
        route="completions", method="POST", path="/v1/completions", headers={}
    )
    trace.request("completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3})
    attempt = trace.attempt(
        number=1, provider="local", model="tiny", upstream_model="tiny", local=True
    )
    now = time.monotonic()
    attempt.engine_phases(
        EnginePhases(
            queued_at=now - 0.5,
            scheduled_at=now - 0.4,
            first_token_at=now - 0.1,
            finished_at=now,
            prompt_tokens=12,
            output_tokens=3,
        )
    )
    attempt.end("ok")
    trace.end(200)
    await flushed(tracing)
    root, engine = sorted(receiver.wait_for_spans(2), key=lambda span: span.kind != SERVER)
    assert root.name == engine.name == "text_completion tiny"
    assert engine.kind == INTERNAL  # the model runs in this process
    assert [name for name, _, _ in engine.events] == [
        "engine.queue",
        "engine.prefill",
        "engine.decode",
    ]
    stamps = [stamp for _, stamp, _ in engine.events]
    assert stamps == sorted(stamps)
    assert abs((stamps[2] - stamps[0]) / 1e9 - 0.4) < 0.01
    queue, prefill, decode = (attributes for _, _, attributes in engine.events)
    assert abs(queue["duration_s"] - 0.1) < 1e-6 and abs(prefill["duration_s"] - 0.3) < 1e-6
    assert prefill["gen_ai.usage.input_tokens"] == 12
    assert decode["gen_ai.usage.output_tokens"] == 3
    assert abs(time.time_ns() - stamps[2] - 0.1e9) < 0.5e9  # on the wall clock


async def test_server_errors_mark_the_request_span(
    make_tracing: MakeTracing, receiver: OtlpReceiver
) -> None:
    tracing = make_tracing(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
    for status in (429, 502):
        trace = tracing.start_request(
            route="embeddings", method="POST", path="/v1/embeddings", headers={}
        )
        with pytest.raises(KeyError), trace.stage("limits"):
            raise KeyError("secret detail")
        trace.end(status)
        trace.end(status)  # a second end changes nothing
    await flushed(tracing)
    spans = receiver.wait_for_spans(4)
    roots = [span for span in spans if span.name == "POST /v1/embeddings"]
    assert [(r.attributes["error.type"], r.status_code) for r in roots] == [("429", 0), ("502", 2)]
    stages = [span for span in spans if span.name == "limits"]
    assert {(s.attributes["error.type"], s.status_code) for s in stages} == {("KeyError", 2)}
    assert all(b"secret detail" not in body for body in receiver.bodies)
