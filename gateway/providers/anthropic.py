"""Anthropic's native Messages API: ``{base_url}/messages`` (and ``/messages/count_tokens``)
with ``x-api-key`` and ``anthropic-version``.

Native means nothing is lost on the way: prompt-caching markers, thinking blocks with their
signatures, server tools, and the exact usage with cache reads and writes (priced with the
model's ``cached_input`` and ``cache_write_input``). Clients of other formats are translated
into the Messages format by the gateway (``gateway/formats``) before they get here; a request
without ``max_tokens`` gets the provider's ``default_max_tokens``. Other operations
(embeddings, audio, images) are refused so the dispatcher moves on.
"""

from __future__ import annotations

from gateway.formats.anthropic_messages import parse_error
from gateway.formats.errors import ErrorInfo
from gateway.policy import ANTHROPIC_DEFAULT_VERSION, ProviderConfig
from gateway.providers.http_provider import HttpProvider
from gateway.settings import UpstreamSettings

MESSAGES_PATHS = frozenset({"/messages", "/messages/count_tokens"})


class AnthropicProvider(HttpProvider):
    def __init__(self, name: str, config: ProviderConfig, upstream: UpstreamSettings) -> None:
        self.version = config.anthropic_version or ANTHROPIC_DEFAULT_VERSION
        super().__init__(name, config, upstream)

    def serves(self, path: str) -> bool:
        return path in MESSAGES_PATHS

    def read_error(self, status: int, body: bytes) -> ErrorInfo:
        return parse_error(status, body)

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": self.version}
        if api_key:
            headers["x-api-key"] = api_key
        return headers
