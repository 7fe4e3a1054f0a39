"""Vertex AI: Gemini models on ``generateContent`` and Anthropic's Claude on ``rawPredict``,
under ``{base_url}/projects/{project}/locations/{location}/publishers/{publisher}/models/``,
with an OAuth bearer token (``google_auth.GoogleTokenSource``).

A provider serves one publisher's models (the policy's ``vertex.publisher``): ``google`` speaks
Gemini's format (``:generateContent``, ``:streamGenerateContent?alt=sse``) and serves
``/v1/embeddings`` (``:predict``, whose statistics count the tokens) and
``/v1/messages/count_tokens`` (``:countTokens``) from those doors' bodies; ``anthropic``
speaks Anthropic's Messages format (``:rawPredict``, ``:streamRawPredict``), whose body names
no model and carries ``anthropic_version: vertex-2023-10-16``, and counts tokens at the
``count-tokens`` model. Errors are Google's envelope for what Vertex refuses itself (auth,
quota) and the publisher's own for what the model refuses.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from gateway.formats import anthropic_messages, gemini
from gateway.formats.anthropic_messages.response import TokenCount
from gateway.formats.error_body import error_member
from gateway.formats.errors import ErrorInfo, FormatError, UpstreamProtocolError
from gateway.formats.openai_embeddings import (
    embedding_dimensions,
    embedding_inputs,
    render_embeddings,
)
from gateway.policy import ProviderConfig
from gateway.policy.clouds import VERTEX_ANTHROPIC_VERSION
from gateway.providers.base import Headers, UpstreamResponse
from gateway.providers.cloud_http import COUNT_TOKENS_PATH, EMBEDDINGS_PATH, CloudHttpProvider
from gateway.providers.gemini import (
    CHAT_PATH,
    answered,
    counted_request,
    method_suffix,
)
from gateway.providers.google_auth import GoogleTokenSource
from gateway.settings import UpstreamSettings

MESSAGES_PATHS = frozenset({"/messages", "/messages/count_tokens"})
_GOOGLE_METHODS = {EMBEDDINGS_PATH: ":predict", COUNT_TOKENS_PATH: ":countTokens"}


class VertexAIProvider(CloudHttpProvider):
    def __init__(self, name: str, config: ProviderConfig, upstream: UpstreamSettings) -> None:
        assert config.vertex is not None  # the policy requires it for this kind
        self.vertex = config.vertex
        self.tokens = GoogleTokenSource(name, config.vertex.credentials_file)
        super().__init__(name, config, upstream)
        if not self.anthropic:
            self.door_paths = frozenset({EMBEDDINGS_PATH, COUNT_TOKENS_PATH})

    @property
    def anthropic(self) -> bool:
        return self.vertex.publisher == "anthropic"

    def serves(self, path: str) -> bool:
        if self.anthropic:
            return path in MESSAGES_PATHS
        return path == CHAT_PATH or path in self.door_paths

    def endpoint(self, path: str, model: str, *, stream: bool) -> str:
        vertex = self.vertex
        models = (
            f"{self.base_url}/projects/{vertex.project}/locations/{vertex.location}"
            f"/publishers/{vertex.publisher}/models"
        )
        if not self.anthropic:
            method = _GOOGLE_METHODS.get(path) or method_suffix(stream)
            return f"{models}/{quote(model, safe='@')}{method}"
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

    async def embeddings(self, body: dict[str, Any], headers: Headers | None) -> UpstreamResponse:
        model = str(body.get("model") or "")
        try:
            texts, dimensions = embedding_inputs(body), embedding_dimensions(body)
        except FormatError as exc:
            raise self.refusal(exc) from None
        payload: dict[str, Any] = {"instances": [{"content": text} for text in texts]}
        if dimensions is not None:
            payload["parameters"] = {"outputDimensionality": dimensions}
        reply = await self.call_json(EMBEDDINGS_PATH, model, payload, headers)
        predictions = reply.data.get("predictions")
        if not isinstance(predictions, list) or len(predictions) != len(texts):
            raise self.http.protocol_error("answered predict with other predictions")
        vectors: list[Any] = []
        tokens = 0
        for prediction in predictions:
            embedding = prediction.get("embeddings") if isinstance(prediction, dict) else None
            embedding = embedding if isinstance(embedding, dict) else {}
            vectors.append(embedding.get("values"))
            statistics = embedding.get("statistics")
            count = statistics.get("token_count") if isinstance(statistics, dict) else None
            tokens += int(count) if isinstance(count, int | float) and count >= 0 else 0
        try:
            return answered(render_embeddings(body, vectors, model, tokens))
        except UpstreamProtocolError as exc:
            raise self.http.protocol_error(exc.message) from None

    async def count_tokens(self, body: dict[str, Any], headers: Headers | None) -> UpstreamResponse:
        model = str(body.get("model") or "")
        try:
            payload = counted_request(body, model)
        except FormatError as exc:
            raise self.refusal(exc) from None
        reply = await self.call_json(COUNT_TOKENS_PATH, model, payload, headers)
        total = reply.data.get("totalTokens")
        if not isinstance(total, int) or isinstance(total, bool) or total < 0:
            raise self.http.protocol_error("answered countTokens without totalTokens")
        return answered(TokenCount(input_tokens=total))
