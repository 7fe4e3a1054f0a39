"""``ProviderCalls``: the calls both batch APIs make, through the provider the gateway already
has for interactive requests (``HttpProvider``): ``{base_url}{path}`` with its own headers (its
key, its policy ``headers``), its pooled session, timeouts and caps, and its error reading and
scrubbing (``HttpUpstream``), so nothing about authenticating to a provider is written twice.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import UpstreamError
from gateway.providers.http_provider import HttpProvider


class ProviderCalls:
    def __init__(self, provider: HttpProvider, *, result_cap: int) -> None:
        self.provider = provider
        self.result_cap = result_cap  # the most of a results file that is read

    def url(self, path: str) -> str:
        return self.provider.base_url + path

    def headers(self) -> dict[str, str]:
        """The provider's own headers for a call without a JSON body."""
        return {k: v for k, v in self.provider.own_headers.items() if k != "content-type"}

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = self.provider.own_headers
        reply = await self.provider.http.post_json(self.url(path), orjson.dumps(body), headers)
        return reply.data

    async def get(self, path_or_url: str, *, cap: int | None = None) -> bytes:
        url = path_or_url if "://" in path_or_url else self.url(path_or_url)
        return (await self.provider.http.get(url, self.headers(), cap=cap)).body

    async def get_json(self, path: str) -> dict[str, Any]:
        return self.json_object(await self.get(path))

    def json_object(self, body: bytes) -> dict[str, Any]:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise self.provider.http.protocol_error("sent a response that is not JSON") from None
        if not isinstance(data, dict):
            raise self.provider.http.protocol_error("sent an unexpected JSON value")
        return data

    def text(self, value: Any, what: str) -> str:
        """A field the provider must have sent (an id)."""
        if not isinstance(value, str) or not value:
            raise self.provider.http.protocol_error(f"sent no {what}")
        return value

    def error(self, status: int, body: bytes) -> UpstreamError:
        """A request's error result as the gateway relays an interactive one (scrubbed)."""
        return self.provider.http.error_from_status(status, body)
