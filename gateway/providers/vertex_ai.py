"""Vertex AI: Gemini models on ``generateContent`` and Anthropic's Claude on ``rawPredict``,
under ``{base_url}/projects/{project}/locations/{location}/publishers/{publisher}/models/``,
with an OAuth bearer token (``google_auth.GoogleTokenSource``).

A provider serves one publisher's models (the policy's ``vertex.publisher``): ``google`` speaks
Gemini's format (``:generateContent``, ``:streamGenerateContent?alt=sse``); ``anthropic``
speaks Anthropic's Messages format (``:rawPredict``, ``:streamRawPredict``), whose body names
no model and carries ``anthropic_version: vertex-2023-10-16``, and counts tokens at the
``count-tokens`` model. Errors are Google's envelope for what Vertex refuses itself (auth,
quota) and the publisher's own for what the model refuses.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from gateway.formats import anthropic_messages, gemini
from gateway.formats.error_body import error_member
from gateway.formats.errors import ErrorInfo
from gateway.providers.cloud_http import CloudHttpProvider
from gateway.providers.gemini import CHAT_PATH, method_suffix
from gateway.providers.google_auth import GoogleTokenSource
from gateway.providers.http_upstream import UpstreamSettings
from gateway.routing.policy import ProviderConfig
from gateway.routing.policy_clouds import VERTEX_ANTHROPIC_VERSION

MESSAGES_PATHS = frozenset({"/messages", "/messages/count_tokens"})


class VertexAIProvider(CloudHttpProvider):
    def __init__(self, name: str, config: ProviderConfig, upstream: UpstreamSettings) -> None:
        assert config.vertex is not None  # the policy requires it for this kind
        self.vertex = config.vertex
        self.tokens = GoogleTokenSource(name, config.vertex.credentials_file)
        super().__init__(name, config, upstream)

    @property
    def anthropic(self) -> bool:
        return self.vertex.publisher == "anthropic"

    def serves(self, path: str) -> bool:
        return path in MESSAGES_PATHS if self.anthropic else path == CHAT_PATH

    def endpoint(self, path: str, model: str, *, stream: bool) -> str:
        vertex = self.vertex
        models = (
            f"{self.base_url}/projects/{vertex.project}/locations/{vertex.location}"
            f"/publishers/{vertex.publisher}/models"
        )
        if not self.anthropic:
            return f"{models}/{quote(model, safe='@')}{method_suffix(stream)}"
        if path == "/messages/count_tokens":
            return f"{models}/count-tokens:rawPredict"
        method = ":streamRawPredict" if stream else ":rawPredict"
        return f"{models}/{quote(model, safe='@')}{method}"

    def outbound_body(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self.anthropic:
            return super().outbound_body(path, body)
        if path == "/messages/count_tokens":
            return body  # the count-tokens model reads the model from the body
        out = super().outbound_body(path, body)
        out.setdefault("anthropic_version", VERTEX_ANTHROPIC_VERSION)
        return out

    async def authorize(self, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        return {**headers, "authorization": f"Bearer {await self.tokens.token()}"}

    def read_error(self, status: int, body: bytes) -> ErrorInfo:
        error = error_member(body)
        if self.anthropic and isinstance(error, dict) and "status" not in error:
            return anthropic_messages.parse_error(status, body)
        return gemini.parse_error(status, body)

    async def close(self) -> None:
        self.tokens.close()
        await super().close()
