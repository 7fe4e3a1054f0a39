"""OpenTelemetry traces of /v1 requests: an optional extra, off unless OTEL_* variables say so.

``build_tracing()`` returns the app's ``Tracing``: ``OtelTracing`` when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set and the ``otel`` extra is
installed, else ``NoTracing``, whose per-request objects are shared no-ops. The request
pipeline calls ``start_request`` once per request and the ``RequestTrace`` methods along the
way (spans.py says what each does); attributes follow the GenAI semantic conventions
(genai.py) and carry no prompt text unless prompt capture is on. Nothing here imports the
rest of the gateway.
"""

from gateway.tracing.config import TracingConfig, TracingConfigError
from gateway.tracing.factory import build_tracing
from gateway.tracing.spans import (
    NO_ATTEMPT,
    NO_REQUEST,
    NO_STAGE,
    AttemptTrace,
    EnginePhases,
    NoTracing,
    RequestTrace,
    Stage,
    Tracing,
)

__all__ = [
    "NO_ATTEMPT",
    "NO_REQUEST",
    "NO_STAGE",
    "AttemptTrace",
    "EnginePhases",
    "NoTracing",
    "RequestTrace",
    "Stage",
    "Tracing",
    "TracingConfig",
    "TracingConfigError",
    "build_tracing",
]
