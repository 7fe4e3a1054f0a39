"""What every provider that calls an upstream over HTTP shares: one pooled aiohttp session,
timeouts, caps on what is read, and failures made safe to relay.

``HttpUpstream(provider, settings, ...)`` is built once per provider and used by its adapter
(``http_provider`` and the ``anthropic``, ``azure_openai`` kinds, fleets); the adapter decides URLs, bodies
and its own headers, this class does the call:

- ``post_json(url, body, headers)`` → ``UpstreamResponse`` (a JSON object, read up to
  ``UpstreamSettings.max_body_bytes``);
- ``open_stream(url, body, headers)`` → ``SseStream``, whose ``batches()`` yields each SSE
  event's ``data`` payload (``[DONE]`` last when the upstream sends one), the events of one
  read together, and simply ends when the upstream's body ends: whether the stream was
  *complete* is its wire format's to say;
- ``forward(url, body, headers)`` → ``RawReply``: any body out (bytes or an async iterator of
  chunks, a multipart upload streamed through), any 2xx body back (audio, text), capped;
- ``open_response(url, body, headers)``: a status-checked answer whose body the caller reads
  (a stream framed other than as SSE: Bedrock's event stream);
- ``get(url, headers, cap=...)`` → ``RawReply``: a GET (a provider's batch API: a batch's
  status, its results file), capped at ``cap`` bytes (default ``max_body_bytes``).

aiohttp was chosen by measurement on this box (one client, keep-alive, small JSON bodies):
aiohttp.ClientSession ~1,560 / 2,390 req/s at concurrency 1 / 64, plain httpx.AsyncClient
~440 / 150, httpx over aiohttp ~600 / 1,000.

Failures are ``UpstreamError`` (502, or the upstream's own 4xx; ``upstream_status`` keeps
what the upstream answered) and ``UpstreamTimeout`` (504), never a bare exception; a timeout or
a connect error keeps its aiohttp cause (``__cause__``), so a fleet can tell a replica that is
gone from a slow answer. What an upstream says is never relayed as is: an upstream 401/403 (it
refused *our* credentials) is a 502 ``upstream_auth_failed`` naming the provider; an error body
is read with the provider's wire format (``read_error``: a format's ``parse_error``, which also
recognises ``context_length_exceeded`` and ``content_filter``), and its text is cut short and
scrubbed of the provider's secrets and anything shaped like a credential (``gateway.redact``).
A body past its cap is a 502 ``upstream_response_too_large``, and nothing beyond the cap is
buffered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping

import aiohttp
import orjson
from aiohttp.typedefs import StrOrURL

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.formats import openai_errors
from gateway.formats.error_body import error_member
from gateway.formats.errors import ErrorInfo
from gateway.formats.sse import SSEDataReader
from gateway.providers.base import RawReply, UpstreamResponse
from gateway.providers.capped_read import BodyTooLarge, read_capped
from gateway.redact import redact
from gateway.settings import UpstreamSettings

_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ClientOSError, ConnectionError)
_RETRYABLE_4XX = frozenset({408, 409, 429})
_AUTH_STATUSES = frozenset({401, 403})
# An error body is read this far at most: only a short excerpt of it is ever relayed.
_ERROR_BODY_BYTES = 64 * 1024
_MAX_ERROR_FIELD_CHARS = 100  # type, code and param of a relayed upstream error

# A wire format's reading of an error body: ``(status, body) -> ErrorInfo``.
ErrorReader = Callable[[int, bytes], ErrorInfo]


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delta-seconds form); None when absent or unreadable."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: rare from LLM APIs, fall back to our own backoff
    return seconds if seconds >= 0 else None


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


def _short(value: str | None, secrets: tuple[str, ...]) -> str | None:
    return redact(value, secrets, _MAX_ERROR_FIELD_CHARS) if value else None


def _error_type(body: bytes) -> str | None:
    """The upstream's own ``error.type`` string (either envelope keeps it there)."""
    error = error_member(body)
    value = error.get("type") if isinstance(error, dict) else None
    return value if isinstance(value, str) else None


class HttpUpstream:
    """One provider's pooled HTTP client. ``secrets`` are scrubbed out of any upstream text
    that is relayed; ``read_error`` reads the provider's error bodies (OpenAI's by default)."""

    def __init__(
        self,
        provider: str,
        settings: UpstreamSettings,
        *,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        pool_size: int | None = None,
        secrets: tuple[str, ...] = (),
        read_error: ErrorReader = openai_errors.parse_error,
    ) -> None:
        self.provider = provider
        self.settings = settings
        self.timeout = aiohttp.ClientTimeout(
            total=settings.total_timeout_s,
            connect=min(
                settings.connect_timeout_s, connect_timeout_s or settings.connect_timeout_s
            ),
            sock_read=min(settings.read_timeout_s, read_timeout_s or settings.read_timeout_s),
        )
        self.secrets = secrets
        self.pool_size = pool_size or settings.pool_size
        self.read_error = read_error
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use so that it binds to the serving event loop.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.pool_size, ttl_dns_cache=300, keepalive_timeout=30
            )
            # No cookie jar: the session serves every tenant, so a cookie one answer set
            # would go out with everyone's next request to the provider.
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self.timeout,
                auto_decompress=True,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- calls ---------------------------------------------------------------------------

    async def post_json(
        self, url: StrOrURL, body: bytes, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        """POST ``body``; the answer must be a JSON object within the body cap."""
        reply = await self._call(url, body, headers)
        try:
            data = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            raise self.protocol_error("sent a response that is not JSON") from None
        if not isinstance(data, dict):
            raise self.protocol_error("sent an unexpected JSON value")
        return UpstreamResponse(reply.status, reply.body, data)

    async def forward(
        self,
        url: str,
        body: bytes | AsyncIterable[bytes],
        headers: Mapping[str, str],
    ) -> RawReply:
        """POST any body (a streamed upload too) and return any 2xx answer, capped."""
        return await self._call(url, body, headers)

    async def get(
        self, url: StrOrURL, headers: Mapping[str, str], *, cap: int | None = None
    ) -> RawReply:
        """GET ``url``: any 2xx answer, read up to ``cap`` bytes (``max_body_bytes`` unless
        given: a batch's results file may be larger than any one answer)."""
        return await self._call(url, None, headers, method="GET", cap=cap)

    async def _call(
        self,
        url: StrOrURL,
        body: bytes | AsyncIterable[bytes] | None,
        headers: Mapping[str, str],
        *,
        method: str = "POST",
        cap: int | None = None,
    ) -> RawReply:
        cap = cap or self.settings.max_body_bytes
        try:
            async with self._client().request(
                method, url, data=body, headers=dict(headers)
            ) as response:
                status = response.status
                retry_after = response.headers.get("Retry-After")
                content_type = response.headers.get("Content-Type", "application/octet-stream")
                if status >= 400:
                    raw = await _read_error_body(response)
                else:
                    try:
                        raw = await read_capped(response, cap)
                    except BodyTooLarge:
                        raise self._too_large("a response", cap) from None
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise self.timeout_error() from exc
        except (*_CONNECT_ERRORS, aiohttp.ClientError) as exc:
            raise self.connect_error(exc) from exc
        if status >= 400:
            raise self.error_from_status(status, raw, retry_after)
        return RawReply(status, raw, content_type)

    async def open_stream(
        self, url: StrOrURL, body: bytes, headers: Mapping[str, str]
    ) -> SseStream:
        """Send the request and check the status; the caller then reads ``batches()``."""
        return SseStream(self, await self.open_response(url, body, headers))

    async def open_response(
        self, url: StrOrURL, body: bytes, headers: Mapping[str, str]
    ) -> aiohttp.ClientResponse:
        """Send the request and check the status: the answer's body is the caller's to read
        (a stream framed other than as SSE: Bedrock's event stream) and to release."""
        try:
            response = await self._client().post(url, data=body, headers=dict(headers))
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise self.timeout_error() from exc
        except (*_CONNECT_ERRORS, aiohttp.ClientError) as exc:
            raise self.connect_error(exc) from exc
        if response.status >= 400:
            try:
                raw = await _read_error_body(response)
            finally:
                response.release()
            raise self.error_from_status(response.status, raw, response.headers.get("Retry-After"))
        return response

    # -- failures ------------------------------------------------------------------------

    def connect_error(self, exc: BaseException) -> UpstreamError:
        return UpstreamError(
            f"upstream provider {self.provider} is unreachable ({type(exc).__name__})",
            kind="connect",
            provider=self.provider,
        )

    def timeout_error(self) -> UpstreamTimeout:
        return UpstreamTimeout(
            f"upstream provider {self.provider} timed out", provider=self.provider
        )

    def protocol_error(self, what: str) -> UpstreamError:
        return UpstreamError(
            f"upstream provider {self.provider} {what}", kind="protocol", provider=self.provider
        )

    def _too_large(self, what: str, cap: int) -> UpstreamError:
        return UpstreamError(
            f"upstream provider {self.provider} sent {what} larger than the gateway's limit of "
            f"{cap} bytes",
            retryable=False,
            kind="protocol",
            provider=self.provider,
            code="upstream_response_too_large",
        )

    def error_from_status(
        self, status: int, body: bytes, retry_after: str | None = None
    ) -> UpstreamError:
        """An upstream's error answer as the scrubbed error the gateway relays."""
        provider, secrets = self.provider, self.secrets
        info = self.read_error(status, body)
        if status in _AUTH_STATUSES or info.kind == "authentication":
            # Our credentials were refused: the client's own key is fine, so never a 401 for it.
            # (Gemini says so with a 400 whose details name the key: a 401 all the same.)
            return UpstreamError(
                f"provider '{provider}' rejected the gateway's credentials (upstream HTTP {status})",
                status=502,
                retryable=False,
                kind="auth",
                provider=provider,
                code="upstream_auth_failed",
                upstream_status=status if status in _AUTH_STATUSES else 401,
            )
        if info.message == f"upstream returned HTTP {status}":
            # No message the format could read: its text, scrubbed, says more than the status.
            text = body[:_ERROR_BODY_BYTES].decode("utf-8", "replace").strip()
            info = ErrorInfo(status, text or info.message, info.kind, info.code, info.param)
        message = redact(info.message, secrets) or f"upstream returned HTTP {status}"
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
                code=_short(info.code, secrets),
                upstream_body={
                    "error": {
                        "message": message,
                        "type": _short(_error_type(body), secrets),
                        "param": _short(info.param, secrets),
                        "code": _short(info.code, secrets),
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

    @contextlib.contextmanager
    def reading_stream(self) -> Iterator[None]:
        """Around the reads of a stream's body (SSE, Bedrock's event stream): a stall past the
        read timeout, or a connection that breaks, as the error the gateway relays."""
        name = self.provider
        try:
            yield
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

    def stream_error(self, info: ErrorInfo) -> UpstreamError:
        """An error event an upstream sent mid-stream, scrubbed (never retried: bytes went out)."""
        message = redact(info.message, self.secrets) or "no message"
        return UpstreamError(
            f"upstream provider {self.provider} reported an error mid-stream: {message}",
            retryable=False,
            kind="status",
            provider=self.provider,
            code=_short(info.code, self.secrets),
        )


class SseStream:
    """Server-sent events from upstream, each read's whole events yielded together."""

    route_note: str | None = None  # one upstream: nothing to add to x-switchyard-route

    def __init__(self, upstream: HttpUpstream, response: aiohttp.ClientResponse) -> None:
        self.upstream = upstream
        self.response = response

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """Each event's data (``[DONE]`` included, and last), in lists of the events one read
        of the body completed; ends with the upstream's body. An event past
        ``max_event_bytes``, a stall or a broken connection raise ``UpstreamError``."""
        upstream = self.upstream
        cap = upstream.settings.max_event_bytes
        reader = SSEDataReader(cap)
        try:
            with upstream.reading_stream():
                while chunk := await self.response.content.readany():
                    events = reader.feed(chunk)
                    if b"[DONE]" in events:
                        yield events[: events.index(b"[DONE]") + 1]
                        return
                    if events:
                        yield events
                    if reader.too_large:
                        self.response.close()  # the rest of the event is never read
                        raise upstream._too_large("a stream event", cap)
        finally:
            self.response.release()
        last = reader.close()
        if last is not None:
            yield [last]

    def close(self) -> None:
        self.response.close()
