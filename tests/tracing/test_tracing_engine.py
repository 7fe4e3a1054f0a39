"""The local engine's queue, prefill and decode as span events of the try it served, through a
gateway (tracing on, pointed at the loopback receiver) serving a tiny checkpoint on the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from otlp_receiver import OtlpReceiver, ReceivedSpan
from polling import wait_for

POLICY = """
providers:
  home:
    kind: local
    engine:
      model: {checkpoint}
      device: cpu
      max_num_seqs: 2
models:
  tiny:
    provider: home
"""


def of_trace(receiver: OtlpReceiver, trace_id: str, count: int) -> list[ReceivedSpan] | None:
    spans = [span for span in receiver.spans_now() if span.trace_id == trace_id]
    return spans if len(spans) >= count else None


PHASES = ["engine.queue", "engine.prefill", "engine.decode"]


@pytest.fixture(scope="module")
def engine_gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, session_receiver: OtlpReceiver
) -> Iterator[RunningGateway]:
    from tiny_checkpoint import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("traced-engine")
    checkpoint = write_tiny_checkpoint(root / "tiny-qwen3", arch="qwen3")
    policy = root / "routing_rules.yaml"
    policy.write_text(POLICY.format(checkpoint=checkpoint))
    with pytest.MonkeyPatch.context() as env:  # read when the app builds its tracing
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", session_receiver.endpoint)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        runner = GatewayThread(make_settings(Path(root), policy, redis_url), start_timeout_s=120)
        gateway = runner.start()
    try:
        yield gateway
    finally:
        runner.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_engine_phases_are_events_of_the_try(
    engine_gateway: RunningGateway, receiver: OtlpReceiver, stream: bool
) -> None:
    _, key = engine_gateway.create_key(name="engine")
    client = openai.OpenAI(base_url=engine_gateway.v1, api_key=key, max_retries=0)
    question = [{"role": "user", "content": "hello there"}]
    trace_id = ("b" if stream else "a") * 32
    traced = {"traceparent": f"00-{trace_id}-{'1' * 16}-01"}
    if stream:
        chunks = list(
            client.chat.completions.create(
                model="tiny",
                messages=question,
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=traced,
            )
        )
        usage = chunks[-1].usage
    else:
        answer = client.chat.completions.create(
            model="tiny", messages=question, max_tokens=6, extra_headers=traced
        )
        usage = answer.usage
    assert usage is not None
    spans = wait_for(lambda: of_trace(receiver, trace_id, 5), timeout_s=10)
    (tried,) = [span for span in spans if "switchyard.attempt" in span.attributes]
    assert tried.kind == 1  # INTERNAL: in process, not a network call
    events = {name: (at, attributes) for name, at, attributes in tried.events}
    assert list(events) == PHASES
    times = [events[name][0] for name in PHASES]
    assert times == sorted(times) and tried.start_ns <= times[0] <= tried.end_ns
    assert events["engine.prefill"][1]["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert events["engine.decode"][1]["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert all(events[name][1]["duration_s"] >= 0 for name in PHASES)
