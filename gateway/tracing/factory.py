"""Builds the app's tracing from the environment: OpenTelemetry when enabled and installed,
otherwise the do-nothing tracing (its ``reason`` says why, for the start-up log line)."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.tracing.config import TracingConfig
from gateway.tracing.spans import NoTracing, Tracing


def build_tracing(
    *, capture_prompts: bool = False, environ: Mapping[str, str] | None = None
) -> Tracing:
    """``environ`` decides on or off (default ``os.environ``); the SDK itself always reads
    ``os.environ`` for the endpoint and its other settings. Raises ``TracingConfigError``."""
    config = TracingConfig.from_env(environ, capture_prompts=capture_prompts)
    if not config.enabled:
        return NoTracing(config.reason)
    try:
        from gateway.tracing.otel import OtelTracing
    except ImportError:
        return NoTracing(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the otel extra is not installed "
            "(in the checkout: pip install '.[otel]')"
        )
    return OtelTracing(config)
