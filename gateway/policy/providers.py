"""The ``providers:`` section: each upstream's kind, address, credentials, headers and formats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from gateway.policy.base import StrictModel
from gateway.policy.clouds import (
    BedrockConfig,
    VertexConfig,
    check_cloud_fields,
    cloud_base_url,
    cloud_formats,
)
from gateway.policy.engine import LocalEngineSettings, SpillWhen
from gateway.policy.fleet import FleetConfig
from gateway.policy.headers import HeaderValue, missing_header_env

ProviderKind = Literal[
    "openai_compatible",
    "azure_openai",
    "anthropic",
    "local",
    "engine_fleet",
    "gemini",
    "vertex_ai",
    "bedrock",
]
# The last two only upstreams speak (Gemini's generateContent, Bedrock's Converse).
ChatFormat = Literal[
    "openai_chat", "anthropic_messages", "openai_responses", "gemini", "bedrock_converse"
]
# The chat wire formats each kind speaks natively, and those it may be told it also speaks.
NATIVE_FORMATS: dict[str, tuple[ChatFormat, ...]] = {
    "openai_compatible": ("openai_chat",),
    "azure_openai": ("openai_chat",),
    "anthropic": ("anthropic_messages",),
    "local": ("openai_chat",),
    "engine_fleet": ("openai_chat",),
    # the cloud kinds (policy/clouds.py): vertex_ai's follow its publisher
    "gemini": ("gemini",),
    "vertex_ai": ("gemini",),
    "bedrock": ("bedrock_converse",),
}
_OPTIONAL_FORMATS: dict[str, frozenset[str]] = {
    "openai_compatible": frozenset({"openai_chat", "openai_responses"}),
}
# Headers no provider is ever sent from a client, whatever forward_headers says: hop-by-hop
# ones (RFC 9110 7.6.1) and credentials (the gateway's own go with each provider).
NEVER_FORWARDED = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
        "x-api-key",
        "api-key",
        "cookie",
        "set-cookie",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "content-encoding",
        "expect",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
    }
)
DEFAULT_BASE_URLS = {"anthropic": "https://api.anthropic.com/v1"}
# Who runs a batch's lines routed to a provider: the gateway (each line a request through the
# pipeline) or, for these kinds, the provider's own batch API (docs/batches.md).
BatchMode = Literal["gateway", "native"]
NATIVE_BATCH_KINDS = ("openai_compatible", "anthropic")
AZURE_DEFAULT_API_VERSION = "2024-10-21"
ANTHROPIC_DEFAULT_VERSION = "2023-06-01"


def never_forwarded(name: str) -> bool:
    """A client header that must not reach a provider (hop-by-hop, credentials, proxies)."""
    lowered = name.lower()
    return lowered in NEVER_FORWARDED or lowered.startswith("proxy-")


class ProviderConfig(StrictModel):
    kind: ProviderKind = "openai_compatible"
    base_url: str | None = Field(
        default=None,
        description="openai_compatible: the /v1 base; azure_openai: the resource endpoint "
        "(https://NAME.openai.azure.com); anthropic: default https://api.anthropic.com/v1; "
        "gemini, vertex_ai, bedrock: default the provider's public endpoint",
    )
    api_key_env: str | None = Field(
        default=None, description="env var holding the key; unset at runtime = provider unusable"
    )
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    max_concurrency: int | None = Field(
        default=None, gt=0, description="in-flight requests; beyond it the provider is skipped"
    )
    headers: dict[str, HeaderValue] = Field(
        default_factory=dict,
        description="sent with every call: a literal value, or {value_env: NAME} to read it "
        "from an env var (for credentials: values are masked below the admin role)",
    )
    forward_headers: list[str] = Field(
        default_factory=list,
        description="client headers passed on to this provider (anthropic-beta, "
        "openai-organization...); hop-by-hop and credential headers never are",
    )
    formats: list[ChatFormat] | None = Field(
        default=None,
        description="chat wire formats the upstream serves natively, preferred first (default "
        "by kind; an openai_compatible upstream may add openai_responses)",
    )
    api_version: str | None = Field(
        default=None, description=f"azure_openai: api-version (default {AZURE_DEFAULT_API_VERSION})"
    )
    deployments: dict[str, str] = Field(
        default_factory=dict,
        description="azure_openai: upstream model -> deployment name (default: the model name)",
    )
    anthropic_version: str | None = Field(
        default=None,
        description=f"anthropic: the anthropic-version header (default {ANTHROPIC_DEFAULT_VERSION})",
    )
    default_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="anthropic (and vertex_ai of publisher anthropic): max_tokens sent for "
        "requests that set none (default 4096)",
    )
    batch: BatchMode = Field(
        default="gateway",
        description="how batch lines routed here run: gateway (each a request through the "
        "pipeline) or native (openai_compatible and anthropic only: the provider's own batch "
        "API, polled, at its batch discount)",
    )
    engine: dict[str, Any] | None = Field(
        default=None, description="local engine settings (kind: local only)"
    )
    fleet: FleetConfig | None = Field(
        default=None, description="the replicas and how to route over them (engine_fleet only)"
    )
    spill_when: SpillWhen | None = Field(
        default=None, description="local and engine_fleet: busier than this = skipped (spill)"
    )
    vertex: VertexConfig | None = Field(
        default=None, description="vertex_ai: project, location, publisher, credentials"
    )
    bedrock: BedrockConfig | None = Field(
        default=None, description="bedrock: the AWS region (and profile)"
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> ProviderConfig:
        kind = self.kind
        check_cloud_fields(kind, self.vertex, self.bedrock)
        if kind in ("openai_compatible", "azure_openai") and not self.base_url:
            raise ValueError(f"base_url is required for an {kind} provider")
        if kind not in ("local", "engine_fleet") and self.spill_when is not None:
            raise ValueError("spill_when applies only to local and engine_fleet providers")
        if kind != "local" and self.engine is not None:
            raise ValueError("engine applies only to a local provider")
        if kind == "engine_fleet":
            if self.fleet is None:
                raise ValueError("an engine_fleet provider needs a fleet: block (replicas or dns)")
            if self.base_url is not None:
                raise ValueError(
                    "an engine_fleet provider takes its URLs from fleet:, not base_url"
                )
        elif self.fleet is not None:
            raise ValueError("fleet applies only to an engine_fleet provider")
        if kind != "azure_openai" and (self.api_version is not None or self.deployments):
            raise ValueError("api_version and deployments apply only to an azure_openai provider")
        if kind != "anthropic" and self.anthropic_version is not None:
            raise ValueError("anthropic_version applies only to an anthropic provider")
        speaks_messages = "anthropic_messages" in self.native_formats
        if not speaks_messages and self.default_max_tokens is not None:
            raise ValueError(
                "default_max_tokens applies only to a provider of Anthropic's format "
                "(anthropic, vertex_ai with publisher anthropic)"
            )
        if self.formats is not None:
            allowed = _OPTIONAL_FORMATS.get(kind, frozenset(self._kind_formats))
            wrong = [name for name in self.formats if name not in allowed]
            if wrong or not self.formats:
                raise ValueError(
                    f"formats of a {kind} provider may be: {', '.join(sorted(allowed))}"
                )
        for index, name in enumerate(self.forward_headers):
            if never_forwarded(name):
                raise ValueError(
                    f"forward_headers[{index}]: {name!r} is a hop-by-hop or credential header, "
                    "never forwarded"
                )
        return self

    def missing_env(self, env: Mapping[str, str]) -> tuple[str, str] | None:
        """The first variable this provider needs that ``env`` lacks, and what it holds:
        ``(name, "API key")`` or ``(name, "header value")``; None when all are set."""
        if self.api_key_env and not env.get(self.api_key_env):
            return self.api_key_env, "API key"
        missing = missing_header_env(self.headers, env)
        return (missing, "header value") if missing else None

    @property
    def native_formats(self) -> tuple[ChatFormat, ...]:
        """The chat formats this provider speaks without translation, preferred first."""
        return tuple(self.formats) if self.formats else self._kind_formats

    @property
    def _kind_formats(self) -> tuple[ChatFormat, ...]:
        return cloud_formats(self.kind, self.vertex) or NATIVE_FORMATS[self.kind]

    @property
    def url(self) -> str:
        """The base URL, with the kind's default when the policy leaves it unset."""
        default = DEFAULT_BASE_URLS.get(self.kind) or cloud_base_url(
            self.kind, self.vertex, self.bedrock
        )
        return (self.base_url or default).rstrip("/")

    @property
    def engine_settings(self) -> LocalEngineSettings:
        """The validated ``engine:`` block of a local provider (defaults when absent)."""
        return LocalEngineSettings.model_validate(self.engine or {})
