"""Whether traces are exported, decided by the standard OpenTelemetry environment variables.

Tracing is on when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set, ``OTEL_SDK_DISABLED`` is not ``true`` and ``OTEL_TRACES_EXPORTER`` is not ``none``. The
SDK itself then reads the rest: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, the
sampler (``OTEL_TRACES_SAMPLER``, default: follow the caller's sampled flag, else sample all),
``OTEL_EXPORTER_OTLP_*HEADERS`` / ``*TIMEOUT`` / ``*COMPRESSION`` and ``OTEL_BSP_*``. Only
OTLP over HTTP with protobuf is shipped; asking for another exporter or protocol is refused
(``TracingConfigError`` names the variable) rather than exporting nowhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class TracingConfigError(ValueError):
    """An OTEL_* variable asks for something this gateway cannot do; ``variable`` names it."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


@dataclass(frozen=True)
class TracingConfig:
    enabled: bool
    reason: str  # one line for the start-up log: why tracing is on or off
    capture_prompts: bool = False

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, capture_prompts: bool = False
    ) -> TracingConfig:
        env = os.environ if environ is None else environ
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return cls(False, "OTEL_SDK_DISABLED is true")
        variable = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        endpoint = env.get(variable, "").strip()
        if not endpoint:
            variable = "OTEL_EXPORTER_OTLP_ENDPOINT"
            endpoint = env.get(variable, "").strip()
        if not endpoint:
            return cls(False, "no OTEL_EXPORTER_OTLP_ENDPOINT is set")
        exporters = [
            name.strip().lower() for name in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
        ]
        if exporters == ["none"]:
            return cls(False, "OTEL_TRACES_EXPORTER is none")
        if exporters != ["otlp"]:
            raise TracingConfigError("OTEL_TRACES_EXPORTER", "only otlp (or none) is supported")
        for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = env.get(name, "").strip()
            if protocol:
                if protocol != "http/protobuf":
                    raise TracingConfigError(name, "only http/protobuf is supported")
                break
        reason = f"exporting OTLP/HTTP to {variable}"
        if capture_prompts:
            reason += ", with prompts and completions"
        return cls(True, reason, capture_prompts)
