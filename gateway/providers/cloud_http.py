"""What the cloud kinds (``gemini``, ``vertex_ai``, ``bedrock``) add to ``HttpProvider``.

Their URLs name the model and whether the answer streams (``:generateContent`` or
``:streamGenerateContent?alt=sse``, ``/converse`` or ``/converse-stream``), so the body's
``model`` goes into the URL and not upstream; and Vertex and Bedrock authorize each request on
its own (a bearer token refreshed before it expires, a Signature V4 over the exact bytes sent).
A kind says where an operation goes (``endpoint``), how a request is authorized
(``authorize``) and what of the body is sent (``outbound_body``); the calls, pooling, caps and
error mapping stay ``HttpUpstream``'s. URLs go out exactly as built (``encoded=True``): the
path a Signature V4 covers is the path on the wire.

Operations of other doors that a kind serves by translating their body itself (embeddings,
token counting: ``door_paths``) call ``call_json`` with the body they built; a client body
they cannot carry is ``refusal(...)``: a 400 naming the field, and the dispatcher moves on
to a candidate that may take it.
"""

from __future__ import annotations

import abc
from typing import Any

import orjson
from yarl import URL

from gateway.errors import UpstreamError
from gateway.formats.errors import FormatError
from gateway.providers.base import (
    ClientGone,
    Headers,
    UpstreamResponse,
    refused_request,
    unsupported,
)
from gateway.providers.http_provider import HttpProvider
from gateway.providers.http_upstream import SseStream

# The OpenAI operations a cloud kind serves from the client's body on its own (``door_paths``).
EMBEDDINGS_PATH = "/embeddings"
COUNT_TOKENS_PATH = "/messages/count_tokens"


class CloudHttpProvider(HttpProvider, abc.ABC):
    """``HttpProvider`` with model-and-stream URLs and per-request authorization."""

    @abc.abstractmethod
    def endpoint(self, path: str, model: str, *, stream: bool) -> str:
        """The URL of operation ``path`` for ``model``; ``stream``: the streaming variant."""

    @abc.abstractmethod
    async def embeddings(self, body: dict[str, Any], headers: Headers | None) -> UpstreamResponse:
        """``/v1/embeddings`` in the provider's own embedding call (when in ``door_paths``)."""

    @abc.abstractmethod
    async def count_tokens(self, body: dict[str, Any], headers: Headers | None) -> UpstreamResponse:
        """``/v1/messages/count_tokens`` in the provider's own call (when in ``door_paths``)."""

    async def authorize(self, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        """The headers of one request, credentials added (the default: as they are)."""
        return headers

    def outbound_body(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """What goes upstream of a body whose model is in the URL."""
        return {key: value for key, value in body.items() if key != "model"}

    async def post_json(
        self,
        path: str,
        body: dict[str, Any],
        *,
        headers: Headers | None = None,
        client_gone: ClientGone | None = None,
    ) -> UpstreamResponse:
        if path in self.door_paths:
            if path == EMBEDDINGS_PATH:
                return await self.embeddings(body, headers)
            return await self.count_tokens(body, headers)
        url, payload, outbound = await self.prepare(path, body, headers, stream=False)
        return await self.http.post_json(URL(url, encoded=True), payload, outbound)

    async def open_stream(
        self, path: str, body: dict[str, Any], *, headers: Headers | None = None
    ) -> SseStream:
        url, payload, outbound = await self.prepare(path, body, headers, stream=True)
        return await self.http.open_stream(URL(url, encoded=True), payload, outbound)

    async def prepare(
        self, path: str, body: dict[str, Any], headers: Headers | None, *, stream: bool
    ) -> tuple[str, bytes, dict[str, str]]:
        """The URL, the bytes and the authorized headers of one call."""
        if not self.serves(path):
            raise unsupported(self.name, path, f"a {self.config.kind} provider")
        model = body.get("model")
        url = self.endpoint(path, model if isinstance(model, str) else "", stream=stream)
        payload = orjson.dumps(self.outbound_body(path, body))
        return url, payload, await self.authorize(url, payload, self._headers(headers))

    async def call_json(
        self, path: str, model: str, payload: dict[str, Any], headers: Headers | None
    ) -> UpstreamResponse:
        """POST ``payload`` (already in the provider's format) to operation ``path``."""
        url = self.endpoint(path, model, stream=False)
        raw = orjson.dumps(payload)
        outbound = await self.authorize(url, raw, self._headers(headers))
        return await self.http.post_json(URL(url, encoded=True), raw, outbound)

    def refusal(self, exc: FormatError) -> UpstreamError:
        """A client body this kind cannot carry, as the 400 the dispatcher moves on from."""
        return refused_request(exc, self.name, "untranslatable")
