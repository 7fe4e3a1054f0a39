"""The policy's blocks for the cloud provider kinds: ``gemini``, ``vertex_ai`` and ``bedrock``.

- ``gemini``: Google's Gemini API with an API key (``api_key_env``); no block of its own.
- ``vertex_ai``: Vertex AI, a ``vertex:`` block naming the project, the location and whose
  models the provider serves (``publisher``: ``google`` for Gemini, ``anthropic`` for Claude
  on Vertex's rawPredict); OAuth from a service-account key file, else Application Default
  Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, or workload identity on GKE).
- ``bedrock``: Amazon Bedrock Runtime, a ``bedrock:`` block naming the region (and optionally
  the AWS profile); credentials from the standard AWS chain.

Each kind's default base URL is the provider's public endpoint; ``base_url`` overrides it
(a private endpoint, a regional one, a test upstream).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CLOUD_KINDS = ("gemini", "vertex_ai", "bedrock")
GEMINI_DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class VertexConfig(_Block):
    """A ``vertex_ai`` provider's ``vertex:`` block."""

    project: str = Field(pattern=_NAME, description="the Google Cloud project id")
    location: str = Field(
        default="us-central1",
        pattern=_NAME,
        description="the region (us-central1, europe-west4 ...) or global",
    )
    publisher: Literal["google", "anthropic"] = Field(
        default="google",
        description="whose models: google (Gemini, generateContent) or anthropic (Claude, "
        "rawPredict in Anthropic's Messages format)",
    )
    credentials_file: str | None = Field(
        default=None,
        description="a service-account key (JSON); unset = Application Default Credentials "
        "(GOOGLE_APPLICATION_CREDENTIALS, or workload identity)",
    )

    def base_url(self) -> str:
        host = "aiplatform.googleapis.com"
        if self.location != "global":
            host = f"{self.location}-{host}"
        return f"https://{host}/v1"


class BedrockConfig(_Block):
    """A ``bedrock`` provider's ``bedrock:`` block."""

    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$", description="e.g. us-east-1")
    profile: str | None = Field(
        default=None,
        description="an AWS profile of the shared config files; unset = the standard chain "
        "(environment, shared files, SSO, web identity, container or instance role)",
    )

    def base_url(self) -> str:
        return f"https://bedrock-runtime.{self.region}.amazonaws.com"


def check_cloud_fields(
    kind: str, vertex: VertexConfig | None, bedrock: BedrockConfig | None
) -> None:
    """A block given to the wrong kind, or missing from its own: a ValueError naming it."""
    if kind == "vertex_ai" and vertex is None:
        raise ValueError("a vertex_ai provider needs a vertex: block (project, location)")
    if kind != "vertex_ai" and vertex is not None:
        raise ValueError("vertex applies only to a vertex_ai provider")
    if kind == "bedrock" and bedrock is None:
        raise ValueError("a bedrock provider needs a bedrock: block (region)")
    if kind != "bedrock" and bedrock is not None:
        raise ValueError("bedrock applies only to a bedrock provider")


def cloud_formats(kind: str, vertex: VertexConfig | None) -> tuple[Any, ...] | None:
    """The chat format a cloud kind speaks (None: not a cloud kind)."""
    if kind == "gemini":
        return ("gemini",)
    if kind == "vertex_ai":
        publisher = vertex.publisher if vertex is not None else "google"
        return ("anthropic_messages",) if publisher == "anthropic" else ("gemini",)
    if kind == "bedrock":
        return ("bedrock_converse",)
    return None


def cloud_base_url(kind: str, vertex: VertexConfig | None, bedrock: BedrockConfig | None) -> str:
    if kind == "gemini":
        return GEMINI_DEFAULT_BASE_URL
    if kind == "vertex_ai" and vertex is not None:
        return vertex.base_url()
    if kind == "bedrock" and bedrock is not None:
        return bedrock.base_url()
    return ""
