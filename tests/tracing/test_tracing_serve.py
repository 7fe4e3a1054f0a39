"""Traces of real requests: ``switchyard serve`` with OTEL_EXPORTER_OTLP_ENDPOINT pointed at the
loopback OTLP/HTTP receiver, two loopback upstreams (the first fails, so retries and the
fallback each get a span), the openai SDK as the client, sending its own ``traceparent``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fake_provider import FakeProvider, FakeProviderFleet, Step
from gateway_runner import GatewayProcess
from otlp_receiver import OtlpReceiver, ReceivedSpan
from polling import wait_for

POLICY = """
providers:
  alpha:
    base_url: {alpha}
  beta:
    base_url: {beta}
models:
  first:
    provider: alpha
    upstream_model: alpha-large
  second:
    provider: beta
    upstream_model: beta-small
tasks:
  chat:
    candidates: [first, second]
    cache: {{ttl_s: 60}}
default_task: chat
"""
SECRET_QUESTION = "the launch code is swordfish"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SERVER, CLIENT, INTERNAL = 2, 3, 1  # opentelemetry.proto SpanKind


@pytest.fixture(scope="module")
def fleet() -> Iterator[FakeProviderFleet]:
    with FakeProviderFleet("alpha", "beta") as providers:
        yield providers


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory,
    fleet: FakeProviderFleet,
    session_receiver: OtlpReceiver,
) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("traced")
    policy = root / "routing_rules.yaml"
    policy.write_text(POLICY.format(alpha=fleet["alpha"].base_url, beta=fleet["beta"].base_url))
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": session_receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "switchyard-under-test",
    }
    settings = {"upstream_max_tries": 2, "upstream_backoff_initial_s": 0.01}
    with GatewayProcess(root / "data", policy, env=env, **settings) as gateway:
        yield gateway


def of_trace(receiver: OtlpReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    """The first ``count`` spans of one trace (others may arrive meanwhile)."""

    def found() -> list[ReceivedSpan]:
        return [span for span in receiver.spans_now() if span.trace_id == trace_id]

    wait_for(lambda: len(found()) >= count, timeout_s=10)
    return found()


def by_name(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def test_a_request_with_retries_and_a_fallback_is_one_trace(
    traced: GatewayProcess, fleet: FakeProviderFleet, receiver: OtlpReceiver
) -> None:
    alpha: FakeProvider = fleet["alpha"]
    alpha.play(Step("status", 500), Step("status", 503))
    _, key = traced.create_key(name="traced", team="search")
    client = openai.OpenAI(base_url=traced.v1, api_key=key, max_retries=0)
    answer = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": SECRET_QUESTION}],
        temperature=0,
        max_tokens=20,
        extra_headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
    )
    assert answer.headers["x-switchyard-model"] == "second"
    spans = of_trace(receiver, CLIENT_TRACE, 8)  # the client's trace, honoured
    assert len(spans) == 8

    server = next(span for span in spans if span.kind == SERVER)
    assert server.parent_span_id == CLIENT_SPAN
    assert server.name == "chat auto"
    assert server.resource["service.name"] == "switchyard-under-test"
    attributes = server.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "auto"
    assert attributes["gen_ai.request.temperature"] == 0
    assert attributes["gen_ai.request.max_tokens"] == 20
    assert attributes["gen_ai.response.model"] == "beta-small"  # as the upstream said
    assert attributes["gen_ai.response.id"] == "chatcmpl-beta"
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes["switchyard.model"] == "second"
    assert attributes["gen_ai.usage.input_tokens"] == 10
    assert attributes["gen_ai.usage.output_tokens"] == 5
    assert attributes["http.response.status_code"] == 200
    assert attributes["switchyard.cache"] == "miss"

    children = [span for span in spans if span is not server]
    assert all(span.parent_span_id == server.span_id for span in children)
    for stage in ("authenticate", "limits", "cache", "usage_record"):
        assert by_name(children, stage).kind == INTERNAL
    tries = sorted(
        (span for span in children if span.kind == CLIENT),
        key=lambda span: span.attributes["switchyard.attempt"],
    )
    seen = [
        (
            span.attributes["switchyard.attempt"],
            span.attributes["gen_ai.provider.name"],
            span.attributes["gen_ai.request.model"],
            span.attributes["switchyard.attempt.outcome"],
            span.attributes.get("error.type"),
        )
        for span in tries
    ]
    assert seen == [  # the upstream's 5xx, as the gateway saw it
        (1, "alpha", "alpha-large", "failed", "status"),
        (2, "alpha", "alpha-large", "failed", "status"),
        (3, "beta", "beta-small", "ok", None),
    ]
    assert tries[0].status_code == 2 and tries[2].status_code != 2
    # Each try told its upstream its own span as the parent.
    upstream_parents = [hit.traceparent for hit in alpha.hits + fleet["beta"].hits]
    assert upstream_parents == [f"00-{CLIENT_TRACE}-{span.span_id}-01" for span in tries]
    # No prompt text and no key leaves the gateway unless prompt capture is on.
    exported = b"".join(receiver.bodies)
    assert SECRET_QUESTION.encode() not in exported
    assert key.encode() not in exported
    fleet.reset()


def test_a_cache_hit_is_a_trace_without_upstream_tries(
    traced: GatewayProcess, fleet: FakeProviderFleet, receiver: OtlpReceiver
) -> None:
    _, key = traced.create_key(name="hits", team="hits")
    client = openai.OpenAI(base_url=traced.v1, api_key=key, max_retries=0)
    question: Any = [{"role": "user", "content": "cache me"}]
    client.chat.completions.create(model="auto", messages=question, temperature=0)
    with traced.admin() as admin:
        wait_for(lambda: admin.get("/admin/cache", params={"team": "hits"}).json()["store"])
    hit_trace = "5" * 32  # the first request's spans may still be arriving: look at this one's
    client.chat.completions.create(
        model="auto",
        messages=question,
        temperature=0,
        extra_headers={"traceparent": f"00-{hit_trace}-{CLIENT_SPAN}-01"},
    )
    spans = of_trace(receiver, hit_trace, 5)
    server = next(span for span in spans if span.kind == SERVER)
    assert server.attributes["switchyard.cache"] == "hit"
    assert by_name(spans, "cache").attributes["switchyard.cache"] == "hit"
    assert not [span for span in spans if span.kind == CLIENT]
    assert fleet["alpha"].hit_count() == 1
    fleet.reset()


def test_a_stream_span_ends_with_the_stream(
    traced: GatewayProcess, fleet: FakeProviderFleet, receiver: OtlpReceiver
) -> None:
    _, key = traced.create_key(name="streams")
    client = openai.OpenAI(base_url=traced.v1, api_key=key, max_retries=0)
    stream_trace = "7" * 32
    chunks = client.chat.completions.create(
        model="second",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_headers={"traceparent": f"00-{stream_trace}-{CLIENT_SPAN}-01"},
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "served by beta"
    spans = of_trace(receiver, stream_trace, 5)
    server = next(span for span in spans if span.kind == SERVER)
    (attempt,) = [span for span in spans if span.kind == CLIENT]
    assert server.attributes["gen_ai.request.stream"] is True
    assert server.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert server.attributes["gen_ai.usage.output_tokens"] == 5
    assert server.attributes["switchyard.cache"] == "bypass"  # the model has no cache: block
    assert attempt.attributes["switchyard.attempt.outcome"] == "ok"
    assert attempt.end_ns <= server.end_ns
    fleet.reset()
