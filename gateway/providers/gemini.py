"""Google's Gemini API: ``{base_url}/models/{model}:generateContent`` (and
``:streamGenerateContent?alt=sse``), with the API key in ``x-goog-api-key``.

Clients of every format are translated into Gemini's ``generateContent`` by the gateway
(``gateway/formats/gemini``); streams are Gemini's server-sent events. Errors are Google's
envelope (``{"error": {"code", "message", "status"}}``). Other operations are refused so the
dispatcher moves on.
"""

from __future__ import annotations

from urllib.parse import quote

from gateway.formats import gemini
from gateway.formats.errors import ErrorInfo
from gateway.providers.cloud_http import CloudHttpProvider

CHAT_PATH = "/generateContent"


def model_path(model: str) -> str:
    """``models/{model}``, or the resource name a policy gave (``tunedModels/...``)."""
    name = model if "/" in model else f"models/{model}"
    return quote(name, safe="/@")


def method_suffix(stream: bool) -> str:
    return ":streamGenerateContent?alt=sse" if stream else ":generateContent"


class GeminiProvider(CloudHttpProvider):
    def serves(self, path: str) -> bool:
        return path == CHAT_PATH

    def endpoint(self, path: str, model: str, *, stream: bool) -> str:
        return f"{self.base_url}/{model_path(model)}{method_suffix(stream)}"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def read_error(self, status: int, body: bytes) -> ErrorInfo:
        return gemini.parse_error(status, body)
