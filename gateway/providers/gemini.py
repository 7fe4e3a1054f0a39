"""Google's Gemini API: ``{base_url}/models/{model}:generateContent`` (and
``:streamGenerateContent?alt=sse``), with the API key in ``x-goog-api-key``.

Clients of every format are translated into Gemini's ``generateContent`` by the gateway
(``gateway/formats/gemini``); streams are Gemini's server-sent events. Errors are Google's
envelope (``{"error": {"code", "message", "status"}}``). Two operations of other doors are
served too, their bodies translated here: ``/v1/embeddings`` (OpenAI's body) as
``:batchEmbedContents`` (Gemini counts no tokens for it: the gateway estimates them), and
``/v1/messages/count_tokens`` (Anthropic's body) as ``:countTokens``. Other operations are
refused so the dispatcher moves on.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from gateway.formats import anthropic_messages, gemini
from gateway.formats.anthropic_messages.response import TokenCount
from gateway.formats.errors import ErrorInfo, FormatError, UpstreamProtocolError
from gateway.formats.openai_embeddings import (
    embedding_dimensions,
    embedding_inputs,
    render_embeddings,
)
from gateway.providers.base import Headers, UpstreamResponse
from gateway.providers.cloud_http import COUNT_TOKENS_PATH, EMBEDDINGS_PATH, CloudHttpProvider

CHAT_PATH = "/generateContent"
_METHODS = {EMBEDDINGS_PATH: ":batchEmbedContents", COUNT_TOKENS_PATH: ":countTokens"}


def model_path(model: str) -> str:
    """``models/{model}``, or the resource name a policy gave (``tunedModels/...``)."""
    name = model if "/" in model else f"models/{model}"
    return quote(name, safe="/@")


def method_suffix(stream: bool) -> str:
    return ":streamGenerateContent?alt=sse" if stream else ":generateContent"


def counted_request(body: dict[str, Any], model: str) -> dict[str, Any]:
    """An Anthropic ``count_tokens`` body as the generateContent request it counts."""
    request = anthropic_messages.parse_request({"max_tokens": 1, **body})
    rendered = gemini.render_request(request, model)
    rendered.pop("generationConfig", None)
    rendered.pop("model", None)
    return rendered


def answered(data: dict[str, Any]) -> UpstreamResponse:
    return UpstreamResponse(200, orjson.dumps(data), data)


class GeminiProvider(CloudHttpProvider):
    door_paths = frozenset({EMBEDDINGS_PATH, COUNT_TOKENS_PATH})

    def serves(self, path: str) -> bool:
        return path == CHAT_PATH or path in self.door_paths

    def endpoint(self, path: str, model: str, *, stream: bool) -> str:
        method = _METHODS.get(path) or method_suffix(stream)
        return f"{self.base_url}/{model_path(model)}{method}"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def read_error(self, status: int, body: bytes) -> ErrorInfo:
        return gemini.parse_error(status, body)

    async def embeddings(self, body: dict[str, Any], headers: Headers | None) -> UpstreamResponse:
        model = str(body.get("model") or "")
        try:
            texts, dimensions = embedding_inputs(body), embedding_dimensions(body)
        except FormatError as exc:
            raise self.refusal(exc) from None
        one: dict[str, Any] = {"model": model_path(model)}
        if dimensions is not None:
            one["outputDimensionality"] = dimensions
        requests = [{**one, "content": {"parts": [{"text": text}]}} for text in texts]
        reply = await self.call_json(EMBEDDINGS_PATH, model, {"requests": requests}, headers)
        embeddings = reply.data.get("embeddings")
        if not isinstance(embeddings, list) or len(embeddings) != len(texts):
            raise self.http.protocol_error("answered batchEmbedContents with other embeddings")
        vectors = [item.get("values") if isinstance(item, dict) else None for item in embeddings]
        try:
            return answered(render_embeddings(body, vectors, model, None))
        except UpstreamProtocolError as exc:
            raise self.http.protocol_error(exc.message) from None

    async def count_tokens(self, body: dict[str, Any], headers: Headers | None) -> UpstreamResponse:
        model = str(body.get("model") or "")
        try:
            counted = counted_request(body, model)
        except FormatError as exc:
            raise self.refusal(exc) from None
        payload = {"generateContentRequest": {"model": model_path(model), **counted}}
        reply = await self.call_json(COUNT_TOKENS_PATH, model, payload, headers)
        total = reply.data.get("totalTokens")
        if not isinstance(total, int) or isinstance(total, bool) or total < 0:
            raise self.http.protocol_error("answered countTokens without totalTokens")
        return answered(TokenCount(input_tokens=total))
