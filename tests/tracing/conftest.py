"""Fixtures of the tracing tests: the loopback OTLP receiver, and tracing pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

# pytest puts this folder on sys.path: the helper imports by file name.
from otlp_receiver import OtlpReceiver
from tracing_support import MakeTracing

from gateway.tracing import Tracing, build_tracing

OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


@pytest.fixture(scope="session")
def session_receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def receiver(session_receiver: OtlpReceiver) -> OtlpReceiver:
    session_receiver.clear()
    return session_receiver


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No OTEL_* variable of the machine leaks into a test."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
async def make_tracing(otel_env: pytest.MonkeyPatch) -> AsyncIterator[MakeTracing]:
    """``build_tracing`` with the given OTEL_* variables; closed (flushed) after the test."""
    built: list[Tracing] = []

    def build(capture_prompts: bool = False, **variables: str) -> Tracing:
        for name, value in variables.items():
            otel_env.setenv(name, value)
        tracing = build_tracing(capture_prompts=capture_prompts)
        built.append(tracing)
        return tracing

    yield build
    for tracing in built:
        await tracing.aclose()
