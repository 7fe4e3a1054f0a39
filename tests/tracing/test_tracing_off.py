"""Tracing is decided by the standard OTEL_* variables; off, it exports nothing and a request
keeps no memory; a missing extra or an unsupported exporter says so."""

from __future__ import annotations

import asyncio
import sys
import tracemalloc

import pytest
from otlp_receiver import OtlpReceiver
from tracing_support import MakeTracing

from gateway.tracing import (
    NO_ATTEMPT,
    NO_REQUEST,
    NO_STAGE,
    EnginePhases,
    NoTracing,
    TracingConfig,
    TracingConfigError,
    build_tracing,
)

ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(
    ("environ", "enabled", "reason"),
    [
        ({}, False, "no OTEL_EXPORTER_OTLP_ENDPOINT"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT + "/v1/traces"},
            True,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False, "no OTEL_EXPORTER_OTLP_ENDPOINT"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"},
            False,
            "OTEL_SDK_DISABLED",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"},
            True,
            "OTLP/HTTP",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"},
            False,
            "OTEL_TRACES_EXPORTER",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            True,
            "OTLP/HTTP",
        ),
    ],
)
def test_the_standard_variables_decide(environ: dict, enabled: bool, reason: str) -> None:
    config = TracingConfig.from_env(environ)
    assert config.enabled is enabled and reason in config.reason
    assert ENDPOINT not in config.reason  # the log line names the variable, not its value


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_TRACES_EXPORTER", "otlp,console"),
    ],
)
def test_unsupported_exporters_are_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(TracingConfigError) as refused:
        TracingConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, variable: value})
    assert refused.value.variable == variable


def test_capture_is_said_in_the_reason() -> None:
    config = TracingConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, capture_prompts=True)
    assert config.capture_prompts and "prompts" in config.reason


def hot_path(tracing: NoTracing) -> None:
    """Every call the request pipeline makes, as a streamed request makes them."""
    trace = tracing.start_request(
        route="chat.completions", method="POST", path="/v1/chat/completions", headers={}
    )
    with trace.stage("authenticate"):
        pass
    trace.request("chat.completions", {})
    with trace.stage("limits") as stage:
        stage.set("x", 1)
    attempt = trace.attempt(number=1, provider="p", model="m", upstream_model="m")
    headers: dict[str, str] = {}
    attempt.inject(headers)
    attempt.engine_phases(PHASES)
    for _ in range(8):
        trace.observe_chunk(CHUNK)
    attempt.end("ok", status=200)
    with trace.stage("usage_record"):
        pass
    trace.end(200)
    assert not headers


PHASES = EnginePhases(queued_at=0.0)
CHUNK = {"choices": []}


async def test_off_exports_nothing_and_keeps_no_memory(
    make_tracing: MakeTracing, receiver: OtlpReceiver
) -> None:
    for variables in ({}, {"OTEL_SDK_DISABLED": "true"}):
        tracing = (
            make_tracing(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, **variables)
            if variables
            else make_tracing()
        )
        assert isinstance(tracing, NoTracing) and not tracing.enabled
        trace = tracing.start_request(route="r", method="POST", path="/", headers={})
        assert trace is NO_REQUEST and trace.stage("x") is NO_STAGE
        assert trace.attempt(number=1, provider="p", model="m", upstream_model="m") is NO_ATTEMPT
        hot_path(tracing)  # warm up
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for _ in range(1000):
                hot_path(tracing)
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        assert grown < 4096  # 1000 requests: no per-request allocation is kept
    await asyncio.sleep(0.3)
    assert receiver.bodies == []


def test_a_missing_extra_leaves_tracing_off_and_says_why(otel_env: pytest.MonkeyPatch) -> None:
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    otel_env.delitem(sys.modules, "gateway.tracing.otel", raising=False)
    otel_env.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    tracing = build_tracing()
    assert isinstance(tracing, NoTracing)
    assert "otel extra is not installed" in tracing.reason
