"""A provider over HTTP, written once: ``HttpProvider`` does the calls through ``HttpUpstream``.

As it is, it is the ``openai_compatible`` kind (OpenAI, vLLM, Together, Groq, Gemini's
compatibility layer...): ``{base_url}{path}`` with ``Authorization: Bearer <key>``, every
operation passed on as it is, OpenAI's error bodies. Its native chat format is Chat
Completions; ``formats: [openai_chat, openai_responses]`` in the policy says the upstream also
serves the Responses API (OpenAI does), so Responses clients reach it untranslated. Another
kind (``azure_openai``, ``anthropic``) subclasses it and says only where an operation goes
(``url``), which operations it offers (``serves``), how it authenticates (``auth_headers``) and
how its error bodies read (``read_error``). ``at(base_url)`` is the same provider sending to
another base URL with the same session, headers, caps and error mapping: an engine fleet
(``fleet_provider``) sends each request to the replica it picked through one ``HttpProvider``.

Headers of a call: the client's forwarded ones (already filtered by the caller), then the
policy's ``headers`` for this provider (``value_env`` ones read from the environment here, as
the API key is), then its credentials: the provider's own win. Every key is lower-case, so no
header is ever sent twice under two spellings.
"""

from __future__ import annotations

import copy
import os
from collections.abc import AsyncIterable
from typing import Any, Self

import orjson

from gateway.errors import UpstreamError
from gateway.formats import openai_errors
from gateway.formats.errors import ErrorInfo
from gateway.policy import ProviderConfig
from gateway.policy.headers import header_values
from gateway.providers.base import (
    ClientGone,
    Headers,
    RawReply,
    Unavailable,
    UpstreamResponse,
    unsupported,
)
from gateway.providers.http_upstream import HttpUpstream, SseStream
from gateway.redact import secret_values
from gateway.settings import UpstreamSettings

JSON = "application/json"


class HttpProvider:
    """The calls every HTTP provider makes, with OpenAI's URLs, bearer key and error bodies;
    another kind overrides ``url``, ``serves``, ``auth_headers`` and ``read_error``."""

    door_paths: frozenset[str] = frozenset()  # a door of another format: none here

    def __init__(self, name: str, config: ProviderConfig, upstream: UpstreamSettings) -> None:
        self.name = name
        self.config = config
        self.formats: tuple[str, ...] = config.native_formats
        self.base_url = config.url
        api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        extra_headers = header_values(config.headers, os.environ)
        self.own_headers = {
            "content-type": JSON,
            **{key.lower(): value for key, value in extra_headers.items()},
            **self.auth_headers(api_key),
        }
        self.http = HttpUpstream(
            name,
            upstream,
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.timeout_s,
            pool_size=config.max_concurrency,
            # Scrubbed out of any upstream text that is relayed (its key, its header values).
            secrets=secret_values(config.api_key_env, extra_headers, os.environ),
            read_error=self.read_error,
        )

    # -- what a kind says -----------------------------------------------------------------

    def url(self, base_url: str, path: str, model: str) -> str:
        return base_url + path

    def serves(self, path: str) -> bool:
        return True

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"} if api_key else {}

    def read_error(self, status: int, body: bytes) -> ErrorInfo:
        """An error body in the upstream's wire format (OpenAI's unless the kind says)."""
        return openai_errors.parse_error(status, body)

    # -- the Provider protocol ------------------------------------------------------------

    def unavailable(self) -> Unavailable | None:
        return None  # an upstream's health is the breaker's to judge, from its answers

    def model_note(self) -> str | None:
        return None

    async def close(self) -> None:
        await self.http.close()

    def stream_error(self, info: ErrorInfo) -> UpstreamError:
        """An error event sent mid-stream, as the scrubbed error the gateway relays."""
        return self.http.stream_error(info)

    async def post_json(
        self,
        path: str,
        body: dict[str, Any],
        *,
        headers: Headers | None = None,
        client_gone: ClientGone | None = None,
    ) -> UpstreamResponse:
        """``client_gone`` is not listened to: the HTTP call ends when the client's does."""
        url = self._url(path, body.get("model"))
        return await self.http.post_json(url, orjson.dumps(body), self._headers(headers))

    async def open_stream(
        self, path: str, body: dict[str, Any], *, headers: Headers | None = None
    ) -> SseStream:
        url = self._url(path, body.get("model"))
        return await self.http.open_stream(url, orjson.dumps(body), self._headers(headers))

    async def forward(
        self,
        path: str,
        body: bytes | AsyncIterable[bytes],
        *,
        model: str,
        content_type: str,
        content_length: int | None = None,
        headers: Headers | None = None,
    ) -> RawReply:
        outbound = {**self._headers(headers), "content-type": content_type}
        if content_length is not None:
            outbound["content-length"] = str(content_length)  # else: chunked
        return await self.http.forward(self._url(path, model), body, outbound)

    # -- the same calls to another base URL (a fleet's replica) ---------------------------

    def at(self, base_url: str) -> Self:
        """This provider sending to ``base_url`` instead: the same session, headers, caps and
        error mapping (a shallow copy; closing stays with this one)."""
        sender = copy.copy(self)
        sender.base_url = base_url
        return sender

    def _url(self, path: str, model: Any) -> str:
        if not self.serves(path):
            raise unsupported(self.name, path, f"a {self.config.kind} provider")
        return self.url(self.base_url, path, model if isinstance(model, str) else "")

    def _headers(self, forwarded: Headers | None) -> dict[str, str]:
        if not forwarded:
            return self.own_headers
        return {**forwarded, **self.own_headers}
