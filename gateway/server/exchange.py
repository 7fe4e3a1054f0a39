"""The status the client actually got, for the access log and metrics, whoever answered.

``ExchangeMiddleware`` is the outermost of the app's middleware. It watches the status line
that goes out, so a log line never claims a status the client did not see:

- an exception nothing inside handled becomes the catch-all 500 in OpenAI's envelope (the
  traceback goes to the server log, never to the client), and so does an app that returned
  without answering; after the first byte the connection is cut instead;
- a request whose answer never went out (the client left) counts as 499;
- a handler that writes its own access line (``/v1``, ``/admin``) registers it with
  ``exchange_of(request).on_end(callback)``: the callback runs with that status once the
  answer's last byte is handed to the server (or once the exchange ended without one), in the
  same loop turn, so the client never waits for a log line and its next request finds it;
- any other request that ended in an error (a 404 for an unknown path, a 405, a drain
  refusal, a 500 of any route) gets a ``request`` log line and a count in
  ``switchyard_requests_total`` under its route template (``unmatched`` when no route
  matched: the label set stays bounded). Probes and scrapes are left out.

Requests the HTTP server itself refuses (unparsable, headers too large or too slow) never reach
the app; ``record_wire_rejection`` counts and logs them under the route ``unparsed``.
"""

from __future__ import annotations

import secrets
import time
import traceback
from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from gateway.errors import GatewayError
from gateway.redact import redact
from gateway.server.header_map import header_map

EXCHANGE_KEY = "switchyard.exchange"
REQUEST_ID_HEADER = "x-request-id"
_MAX_REQUEST_ID = 200
_REQUEST_ID_KEY = "switchyard.request_id"
# Set in a request's scope by the HTTP server (http_guard) when it answered the request itself,
# e.g. a 408 for a body that stopped arriving: the client got that, whatever the app sent.
SERVER_STATUS_KEY = "switchyard.server_status"
CLIENT_GONE = 499
UNMATCHED = "unmatched"
UNPARSED = "unparsed"
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_LOGGED_PATH_CHARS = 200

Scope = dict[str, Any]
Message = dict[str, Any]


class Exchange:
    """One request/response as the client saw it."""

    __slots__ = ("_on_end", "finished", "status")

    def __init__(self) -> None:
        self.status: int | None = None  # the status line sent; None until then
        self.finished = False
        self._on_end: Callable[[int], None] | None = None

    def on_end(self, callback: Callable[[int], None]) -> None:
        """Run ``callback(status)`` when the exchange is over, in place of the generic line."""
        self._on_end = callback

    def end(self, status: int) -> bool:
        """Hand ``status`` to the registered callback; False when none was registered.

        The callback is dropped as it runs: it usually holds the request, whose scope holds
        this exchange, and a cycle left behind would wait for the cyclic collector."""
        callback, self._on_end = self._on_end, None
        if callback is None:
            return False
        callback(status)
        return True


def request_id_of(request: Request) -> str:
    """The client's X-Request-ID when it is sane, else a fresh one; the same for the whole
    request (kept in its scope), so its log lines and answer agree."""
    known = request.scope.get(_REQUEST_ID_KEY)
    if known is not None:
        return known
    incoming = header_map(request.scope).get(REQUEST_ID_HEADER)
    if incoming and len(incoming) <= _MAX_REQUEST_ID and incoming.isprintable():
        request_id = incoming
    else:
        request_id = secrets.token_hex(16)
    request.scope[_REQUEST_ID_KEY] = request_id
    return request_id


def exchange_of(request: Request) -> Exchange | None:
    return request.scope.get(EXCHANGE_KEY)


def when_answered(request: Request, callback: Callable[[int], None], status: int) -> None:
    """``callback`` with the status the client got: deferred to the exchange when there is one
    (the app's middleware), else now with ``status`` (a handler mounted on a bare app)."""
    exchange = exchange_of(request)
    if exchange is None:
        callback(status)
    else:
        exchange.on_end(callback)


def unexpected_error_body() -> bytes:
    return GatewayError("The server had an error while processing your request.").body_bytes()


class ExchangeMiddleware:
    """Pure ASGI middleware; see the module docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange()
        scope[EXCHANGE_KEY] = exchange
        started = time.perf_counter()

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                await send(message)
                # The line follows the last byte, not the other way round: the client does
                # not wait for it. It is written before the loop's next turn, so anything the
                # client does next through this gateway (a /metrics scrape) finds it there.
                self._finish(scope, exchange, time.perf_counter() - started)
                return
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
            if exchange.status is None:
                self._log_failure(scope, "the app returned without answering")
                await self._answer_500(scope, observed_send)
        except Exception as exc:
            self._log_failure(scope, repr(exc), traceback.format_exc())
            if exchange.status is not None:
                raise  # mid-answer: the server cuts the connection; nothing else can be said
            await self._answer_500(scope, observed_send)
        finally:
            self._finish(scope, exchange, time.perf_counter() - started)

    @staticmethod
    def _services(scope: Scope) -> Any:
        """The app's services, from the lifespan state the server copies into each request."""
        return scope.get("state", {}).get("services")

    def _log_failure(self, scope: Scope, error: str, trace: str | None = None) -> None:
        services = self._services(scope)
        if services is None:
            return
        services.log.error(
            "unhandled_error",
            request_id=request_id_of(Request(scope)),
            path=scope.get("path", "")[:_LOGGED_PATH_CHARS],
            # An exception's text or traceback may quote a secret (a provider key, a header).
            error=redact(error, limit=1000),
            traceback=None if trace is None else redact(trace, limit=8000),
        )

    @staticmethod
    async def _answer_500(scope: Scope, send: Callable[[Message], Any]) -> None:
        body = unexpected_error_body()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id_of(Request(scope)).encode()),
        ]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _finish(self, scope: Scope, exchange: Exchange, elapsed_s: float) -> None:
        if exchange.finished:
            return
        exchange.finished = True
        status = exchange.status if exchange.status is not None else CLIENT_GONE
        status = scope.get(SERVER_STATUS_KEY, status)
        if exchange.end(status) or status < 400 or scope.get("path") in QUIET_PATHS:
            return
        services = self._services(scope)
        if services is None:
            return
        route = scope.get("route")
        label = getattr(route, "path", None) or UNMATCHED
        services.metrics.requests.labels(label, "-", "-", str(status)).inc()
        services.metrics.latency.labels(label).observe(elapsed_s)
        if services.settings.access_log:
            services.log.info(
                "request",
                request_id=request_id_of(Request(scope)),
                route=label,
                method=scope.get("method"),
                path=scope.get("path", "")[:_LOGGED_PATH_CHARS],
                status=status,
                latency_ms=round(elapsed_s * 1000, 3),
                error="failed",
            )


def record_wire_rejection(state: Any, status: int, reason: str) -> None:
    """A request the HTTP server refused before the app saw it (``http_guard``'s ``on_reject``):
    counted and logged like the others, under the route ``unparsed``. ``state`` is the app's."""
    services = getattr(state, "services", None)
    if services is None:
        return
    services.metrics.requests.labels(UNPARSED, "-", "-", str(status)).inc()
    if services.settings.access_log:
        services.log.info("request", route=UNPARSED, status=status, error=reason)
