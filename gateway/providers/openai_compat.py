"""An OpenAI-compatible upstream over one pooled aiohttp session per provider.

aiohttp was chosen by measurement on this box (one client, keep-alive, small JSON bodies):
aiohttp.ClientSession ~1,560 / 2,390 req/s at concurrency 1 / 64, plain httpx.AsyncClient
~440 / 150, httpx over aiohttp ~600 / 1,000. Failures become ``UpstreamError`` (502, or the
upstream's own 4xx) and ``UpstreamTimeout`` (504), never a bare exception.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.policy import ProviderConfig

_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ClientOSError, ConnectionError)
_RETRYABLE_4XX = frozenset({408, 409, 429})


@dataclass(frozen=True)
class Timeouts:
    connect_s: float
    read_s: float
    total_s: float


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    body: bytes
    data: dict[str, Any]


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delta-seconds form); None when absent or unreadable."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: rare from LLM APIs, fall back to our own backoff
    return seconds if seconds >= 0 else None


def _error_from_status(
    provider: str, status: int, body: bytes, retry_after: str | None = None
) -> UpstreamError:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("error"), dict):
        text = body[:300].decode("utf-8", "replace").strip()
        data = {"error": {"message": text or f"upstream returned HTTP {status}"}}
    if status < 500:
        # A client error from upstream is the client's problem: pass it through as is.
        return UpstreamError(
            data["error"].get("message") or f"upstream returned HTTP {status}",
            status=status,
            retryable=status in _RETRYABLE_4XX,
            retry_after_s=retry_after_seconds(retry_after),
            kind="status",
            provider=provider,
            upstream_body=data,
            # Passed on when nothing else serves, so the client backs off as long as asked.
            headers={"retry-after": retry_after} if retry_after and status == 429 else None,
        )
    return UpstreamError(
        f"upstream provider {provider} failed with HTTP {status}: {data['error'].get('message')}",
        status=502,
        retryable=True,
        retry_after_s=retry_after_seconds(retry_after),
        kind="status",
        provider=provider,
    )


class OpenAICompatProvider:
    def __init__(self, name: str, config: ProviderConfig, timeouts: Timeouts, pool_size: int):
        self.name = name
        self.config = config
        self.base_url = (config.base_url or "").rstrip("/")
        self.timeout = aiohttp.ClientTimeout(
            total=timeouts.total_s,
            connect=min(timeouts.connect_s, config.connect_timeout_s),
            sock_read=min(timeouts.read_s, config.timeout_s),
        )
        self.headers = {"Content-Type": "application/json", **config.headers}
        api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.pool_size = config.max_concurrency or pool_size
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use so that it binds to the serving event loop.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.pool_size, ttl_dns_cache=300, keepalive_timeout=30
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self.timeout,
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
                auto_decompress=True,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _connect_error(self, exc: BaseException) -> UpstreamError:
        return UpstreamError(
            f"upstream provider {self.name} is unreachable ({type(exc).__name__})",
            kind="connect",
            provider=self.name,
        )

    def _timeout_error(self) -> UpstreamTimeout:
        return UpstreamTimeout(f"upstream provider {self.name} timed out", provider=self.name)

    async def post_json(self, path: str, body: dict[str, Any]) -> UpstreamResponse:
        try:
            async with self._client().post(
                self.base_url + path, data=orjson.dumps(body), headers=self.headers
            ) as response:
                raw = await response.read()
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise self._timeout_error() from None
        except (*_CONNECT_ERRORS, aiohttp.ClientError) as exc:
            raise self._connect_error(exc) from exc
        if status >= 400:
            raise _error_from_status(self.name, status, raw, retry_after)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"upstream provider {self.name} sent a response that is not JSON",
                kind="protocol",
                provider=self.name,
            ) from None
        if not isinstance(data, dict):
            raise UpstreamError(
                f"upstream provider {self.name} sent an unexpected JSON value",
                kind="protocol",
                provider=self.name,
            )
        return UpstreamResponse(status, raw, data)

    async def open_stream(self, path: str, body: dict[str, Any]) -> UpstreamStream:
        """Send the request and check the status; the caller then reads ``events()``."""
        try:
            response = await self._client().post(
                self.base_url + path, data=orjson.dumps(body), headers=self.headers
            )
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise self._timeout_error() from None
        except (*_CONNECT_ERRORS, aiohttp.ClientError) as exc:
            raise self._connect_error(exc) from exc
        if response.status >= 400:
            try:
                raw = await response.read()
            except (TimeoutError, aiohttp.ClientError):
                raw = b""
            finally:
                response.release()
            raise _error_from_status(
                self.name, response.status, raw, response.headers.get("Retry-After")
            )
        return UpstreamStream(self, response)


class UpstreamStream:
    """Server-sent events from upstream, yielded one ``data:`` payload at a time."""

    def __init__(self, provider: OpenAICompatProvider, response: aiohttp.ClientResponse) -> None:
        self.provider = provider
        self.response = response

    async def events(self) -> AsyncIterator[bytes]:
        """Each event's data (``[DONE]`` included); raises UpstreamError if cut short."""
        data_lines: list[bytes] = []
        name = self.provider.name
        try:
            while True:
                line = await self.response.content.readline()
                if not line:
                    break
                line = line.rstrip(b"\r\n")
                if line:
                    if line.startswith(b"data:"):
                        data_lines.append(line[5:].lstrip(b" "))
                    continue  # comments, event names and ids are not relayed
                if data_lines:
                    data = b"\n".join(data_lines)
                    data_lines = []
                    yield data
                    if data == b"[DONE]":
                        return
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise UpstreamTimeout(
                f"upstream provider {name} stopped sending mid-stream", provider=name
            ) from None
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise UpstreamError(
                f"upstream provider {name} broke the stream ({type(exc).__name__})",
                kind="protocol",
                provider=name,
            ) from exc
        finally:
            self.response.release()
        if data_lines:
            yield b"\n".join(data_lines)
        raise UpstreamError(
            f"upstream provider {name} ended the stream without [DONE]",
            kind="protocol",
            provider=name,
        )

    def close(self) -> None:
        self.response.close()
