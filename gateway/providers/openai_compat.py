"""An OpenAI-compatible upstream over one pooled aiohttp session per provider.

aiohttp was chosen by measurement on this box (one client, keep-alive, small JSON bodies):
aiohttp.ClientSession ~1,560 / 2,390 req/s at concurrency 1 / 64, plain httpx.AsyncClient
~440 / 150, httpx over aiohttp ~600 / 1,000. Failures become ``UpstreamError`` (502, or the
upstream's own 4xx) and ``UpstreamTimeout`` (504), never a bare exception.

What an upstream says is never relayed as is: an upstream 401/403 (it refused *our*
credentials) is a 502 ``upstream_auth_failed`` naming the provider, and any error text passed on
is cut short and scrubbed of the provider's key and anything shaped like a credential
(``gateway.redact``). Answers are read only up to ``ResponseLimits``: a JSON body past
``max_body_bytes`` or an SSE event past ``max_event_bytes`` is a 502
``upstream_response_too_large``, and nothing beyond the cap is buffered.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp.http_exceptions import LineTooLong

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.providers.base import ClientGone, Timeouts, Unavailable, UpstreamResponse
from gateway.redact import redact, secret_values
from gateway.routing.policy import ProviderConfig
from gateway.settings import Settings

_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ClientOSError, ConnectionError)
_RETRYABLE_4XX = frozenset({408, 409, 429})
_AUTH_STATUSES = frozenset({401, 403})
# An error body is read this far at most: only a short excerpt of it is ever relayed.
_ERROR_BODY_BYTES = 64 * 1024
_MAX_ERROR_FIELD_CHARS = 100  # type, code and param of a relayed upstream error


@dataclass(frozen=True)
class ResponseLimits:
    """How much of an upstream answer the gateway reads before it gives up with a 502."""

    max_body_bytes: int = 64 * 1024 * 1024
    max_event_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class UpstreamSettings:
    """What every OpenAI-compatible upstream shares: the gateway's timeouts (a provider's own
    may only be shorter), the connection pool per provider (unless its ``max_concurrency``
    says otherwise) and the caps on what is read of an answer."""

    timeouts: Timeouts
    pool_size: int = 512
    limits: ResponseLimits = ResponseLimits()

    @classmethod
    def from_settings(cls, settings: Settings) -> UpstreamSettings:
        return cls(
            Timeouts(
                settings.upstream_connect_timeout_s,
                settings.upstream_read_timeout_s,
                settings.upstream_total_timeout_s,
            ),
            settings.upstream_pool_size,
            ResponseLimits(settings.upstream_max_body_bytes, settings.upstream_max_event_bytes),
        )


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delta-seconds form); None when absent or unreadable."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: rare from LLM APIs, fall back to our own backoff
    return seconds if seconds >= 0 else None


class _TooLarge(Exception):
    """The upstream answer went past its cap."""


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The body, or ``_TooLarge`` as soon as it (decompressed) passes ``cap`` bytes."""
    declared = response.content_length
    if declared is not None and declared > cap and not response.headers.get("Content-Encoding"):
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await response.content.readany()
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > cap:
            raise _TooLarge
        chunks.append(chunk)


async def _read_error_body(response: aiohttp.ClientResponse) -> bytes:
    """The first ``_ERROR_BODY_BYTES`` (or so) of an error answer; the rest is never read."""
    chunks: list[bytes] = []
    size = 0
    try:
        while size < _ERROR_BODY_BYTES:
            chunk = await response.content.readany()
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
    except (TimeoutError, aiohttp.ClientError):
        return b"".join(chunks)
    response.close()  # unread bytes may remain: this connection cannot be reused
    return b"".join(chunks)[:_ERROR_BODY_BYTES]


def _short_field(value: Any, secrets: tuple[str, ...]) -> str | None:
    if isinstance(value, str) and value:
        return redact(value, secrets, _MAX_ERROR_FIELD_CHARS)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _error_from_status(
    provider: str,
    status: int,
    body: bytes,
    retry_after: str | None = None,
    secrets: tuple[str, ...] = (),
) -> UpstreamError:
    if status in _AUTH_STATUSES:
        # Our credentials were refused: the client's own key is fine, so never a 401 for it.
        return UpstreamError(
            f"provider '{provider}' rejected the gateway's credentials (upstream HTTP {status})",
            status=502,
            retryable=False,
            kind="auth",
            provider=provider,
            code="upstream_auth_failed",
            upstream_status=status,
        )
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    upstream = data.get("error") if isinstance(data, dict) else None
    if isinstance(upstream, dict):
        raw_message = upstream.get("message")
        text = raw_message if isinstance(raw_message, str) else ""
    else:
        upstream = {}
        text = body[:_ERROR_BODY_BYTES].decode("utf-8", "replace").strip()
    message = redact(text, secrets) or f"upstream returned HTTP {status}"
    if status < 500:
        # A client error from upstream is the client's problem: pass it through, scrubbed.
        return UpstreamError(
            message,
            status=status,
            retryable=status in _RETRYABLE_4XX,
            retry_after_s=retry_after_seconds(retry_after),
            kind="status",
            provider=provider,
            upstream_status=status,
            upstream_body={
                "error": {
                    "message": message,
                    "type": _short_field(upstream.get("type"), secrets),
                    "param": _short_field(upstream.get("param"), secrets),
                    "code": _short_field(upstream.get("code"), secrets),
                }
            },
            # Passed on when nothing else serves, so the client backs off as long as asked.
            headers={"retry-after": retry_after} if retry_after and status == 429 else None,
        )
    return UpstreamError(
        f"upstream provider {provider} failed with HTTP {status}: {message}",
        status=502,
        retryable=True,
        retry_after_s=retry_after_seconds(retry_after),
        kind="status",
        provider=provider,
        upstream_status=status,
    )


def _too_large(provider: str, what: str, cap: int) -> UpstreamError:
    return UpstreamError(
        f"upstream provider {provider} sent {what} larger than the gateway's limit of {cap} bytes",
        retryable=False,
        kind="protocol",
        provider=provider,
        code="upstream_response_too_large",
    )


class OpenAICompatProvider:
    def __init__(self, name: str, config: ProviderConfig, upstream: UpstreamSettings):
        self.name = name
        self.limits = upstream.limits
        self.config = config
        timeouts = upstream.timeouts
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
        # Scrubbed out of any upstream text that is relayed (its key, its extra header values).
        self.secrets = secret_values(config.api_key_env, config.headers, os.environ)
        self.pool_size = config.max_concurrency or upstream.pool_size
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

    def unavailable(self) -> Unavailable | None:
        return None  # an upstream's health is the breaker's to judge, from its answers

    def model_note(self) -> str | None:
        return None

    async def post_json(
        self, path: str, body: dict[str, Any], *, client_gone: ClientGone | None = None
    ) -> UpstreamResponse:
        """``client_gone`` is not listened to: the HTTP call ends when the client's does."""
        return await self.post_json_to(self.base_url, path, body)

    async def post_json_to(
        self, base_url: str, path: str, body: dict[str, Any]
    ) -> UpstreamResponse:
        """``post_json`` to another base URL (a fleet's replica) with this provider's session,
        headers, limits and error mapping. Timeouts and connect errors keep their aiohttp
        cause (``__cause__``), so a caller can tell a connect timeout from a slow answer."""
        try:
            async with self._client().post(
                base_url + path, data=orjson.dumps(body), headers=self.headers
            ) as response:
                status = response.status
                retry_after = response.headers.get("Retry-After")
                if status >= 400:
                    raw = await _read_error_body(response)
                else:
                    try:
                        raw = await _read_capped(response, self.limits.max_body_bytes)
                    except _TooLarge:
                        response.close()  # the rest is never read
                        raise _too_large(
                            self.name, "a response", self.limits.max_body_bytes
                        ) from None
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise self._timeout_error() from exc
        except (*_CONNECT_ERRORS, aiohttp.ClientError) as exc:
            raise self._connect_error(exc) from exc
        if status >= 400:
            raise _error_from_status(self.name, status, raw, retry_after, self.secrets)
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

    async def open_stream(self, path: str, body: dict[str, Any]) -> EventStream:
        """Send the request and check the status; the caller then reads ``events()``."""
        return await self.open_stream_to(self.base_url, path, body)

    async def open_stream_to(self, base_url: str, path: str, body: dict[str, Any]) -> EventStream:
        """``open_stream`` to another base URL (see ``post_json_to``)."""
        try:
            response = await self._client().post(
                base_url + path, data=orjson.dumps(body), headers=self.headers
            )
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise self._timeout_error() from exc
        except (*_CONNECT_ERRORS, aiohttp.ClientError) as exc:
            raise self._connect_error(exc) from exc
        if response.status >= 400:
            try:
                raw = await _read_error_body(response)
            finally:
                response.release()
            raise _error_from_status(
                self.name, response.status, raw, response.headers.get("Retry-After"), self.secrets
            )
        return EventStream(self, response)

    def error_event(self, data: bytes) -> UpstreamError | None:
        """An ``{"error": {...}}`` event sent mid-stream, as a scrubbed error; else None."""
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(event, dict) or "choices" in event:
            return None
        upstream = event.get("error")
        if upstream is None:
            return None
        text = upstream.get("message") if isinstance(upstream, dict) else upstream
        message = redact(text if isinstance(text, str) else "", self.secrets)
        return UpstreamError(
            f"upstream provider {self.name} reported an error mid-stream: "
            + (message or "no message"),
            retryable=False,
            kind="status",
            provider=self.name,
        )


class EventStream:
    """Server-sent events from upstream, yielded one ``data:`` payload at a time."""

    route_note: str | None = None

    def __init__(self, provider: OpenAICompatProvider, response: aiohttp.ClientResponse) -> None:
        self.provider = provider
        self.response = response

    async def events(self) -> AsyncIterator[bytes]:
        """Each event's data (``[DONE]`` included); raises UpstreamError if cut short."""
        data_lines: list[bytes] = []
        provider = self.provider
        name = provider.name
        cap = provider.limits.max_event_bytes
        size = 0
        try:
            while True:
                line = await self.response.content.readline(max_line_length=cap)
                if not line:
                    break
                line = line.rstrip(b"\r\n")
                if line:
                    if line.startswith(b"data:"):
                        data_lines.append(line[5:].lstrip(b" "))
                        size += len(line)
                        if size > cap:
                            raise _TooLarge
                    continue  # comments, event names and ids are not relayed
                if data_lines:
                    data = b"\n".join(data_lines)
                    data_lines = []
                    size = 0
                    # OpenAI's mid-stream error event: a ~0.1 µs test first, chunks are hot.
                    if data.find(b'"error"', 0, 24) >= 0:
                        error = provider.error_event(data)
                        if error is not None:
                            raise error
                    yield data
                    if data == b"[DONE]":
                        return
        except (LineTooLong, _TooLarge):
            self.response.close()  # the rest of the event is never read
            raise _too_large(name, "a stream event", cap) from None
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
