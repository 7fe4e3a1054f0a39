"""uvicorn's httptools protocol with deadlines and a size cap for what the client sends.

Plain uvicorn keeps a connection open for as long as a client trickles its request line,
headers or body (the keep-alive timer only runs between requests, and httptools has no header
size limit). A slow or hostile client then holds a socket and its buffers for ever. Here:

- the request line and headers must arrive within ``header_timeout_s`` of the connection (or
  of the request's first byte on a kept-alive connection), else 408 and close;
- they must fit in ``max_header_bytes``, else 431 and close;
- the body must arrive within ``body_timeout_s`` of the headers, else 408 and close (the
  handler waiting for the body sees a disconnect);
- a request the HTTP parser refuses (bad request line, header or chunked encoding) gets a 400
  in OpenAI's JSON envelope, code ``invalid_http_request``, instead of uvicorn's plain text;
- what an answer writes in one event-loop turn leaves in one send (``joined_writes.py``).

Each answer given before a request reached the app is counted and logged through
``on_reject(status, reason)`` when given; a body deadline's 408 is marked in the request's
scope instead, so the app's own access line carries it.

Pass ``guarded_protocol(settings.http_guard)`` as uvicorn's ``http``
option. This subclasses uvicorn internals (pinned uvicorn); ``tests/server`` exercises every path
against a real server.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.errors import GatewayError, InvalidRequest
from gateway.server.exchange import SERVER_STATUS_KEY
from gateway.server.joined_writes import JoinedWrites
from gateway.settings import HttpGuardSettings

RejectionHook = Callable[[int, str], None]


class RequestTimeout(GatewayError):
    status = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class HeadersTooLarge(GatewayError):
    status = 431
    error_type = "invalid_request_error"
    default_code = "headers_too_large"


class _HeadTooLarge(Exception):
    """Raised inside a parser callback to stop parsing; httptools wraps it."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(
        self,
        *args: Any,
        header_timeout_s: float = 10.0,
        max_header_bytes: int = 64 * 1024,
        body_timeout_s: float = 30.0,
        on_reject: RejectionHook | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes
        self.body_timeout_s = body_timeout_s
        self.on_reject = on_reject
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._rejection: GatewayError | None = None

    # -- connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that never sends a byte is also cut off

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # Headers still incomplete and already too big (one huge header trickled in pieces).
        if self._in_head and self._head_bytes > self.max_header_bytes:
            self._reject(HeadersTooLarge(self._too_large_message()))

    # -- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_header_bytes:
            self._rejection = HeadersTooLarge(self._too_large_message())
            raise _HeadTooLarge()
        self._in_head = False
        self._head_bytes = 0
        self._cancel(self._head_timer)
        self._head_timer = None
        super().on_headers_complete()
        # Its task runs from the next turn on, so the cycle writes through the joiner only.
        self.cycle.transport = JoinedWrites(self.transport, self.loop)  # type: ignore[assignment]
        self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timed_out)

    def on_message_complete(self) -> None:
        self._cancel(self._body_timer)
        self._body_timer = None
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this from inside its ``except HttpParserError`` for every parser error,
        # so the parser's own reason is the exception being handled. A rejection of ours (431)
        # says what it is.
        if self._rejection is not None:
            self._reject(self._rejection)
            return
        reason = str(sys.exception() or msg)[:200]
        self._reject(
            InvalidRequest(
                f"the request is not valid HTTP/1.1: {reason}", code="invalid_http_request"
            )
        )

    # -- deadlines --------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._reject(
                RequestTimeout(
                    f"request headers not received within {self.header_timeout_s:g} seconds"
                )
            )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        error = RequestTimeout(f"request body not received within {self.body_timeout_s:g} seconds")
        if not cycle.response_started:
            self.transport.write(_response_bytes(error))
            # The app logs this request; it must say 408, not the 499 it will see.
            cycle.scope[SERVER_STATUS_KEY] = error.status
        # The handler waiting for the body gets a disconnect; what it sends later is dropped.
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    def _reject(self, error: GatewayError) -> None:
        self._cancel_timers()
        if not self.transport.is_closing():
            self.transport.write(_response_bytes(error))
            self.transport.close()
            self._report(error)

    def _report(self, error: GatewayError) -> None:
        if self.on_reject is not None:
            self.on_reject(error.status, error.code or error.type)

    def _too_large_message(self) -> str:
        return f"request line and headers are larger than {self.max_header_bytes} bytes"

    def _cancel_timers(self) -> None:
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._head_timer = self._body_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()


def _response_bytes(error: GatewayError) -> bytes:
    body = error.body_bytes()
    head = (
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
    )
    return STATUS_LINE[error.status] + head + body


def guarded_protocol(settings: HttpGuardSettings, on_reject: RejectionHook | None = None) -> Any:
    """The ``http`` option for uvicorn: the guarded protocol with these limits; ``on_reject``
    hears of every request refused here (the app's ``record_wire_rejection``)."""
    return functools.partial(
        GuardedHttpToolsProtocol,
        header_timeout_s=settings.header_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        body_timeout_s=settings.body_timeout_s,
        on_reject=on_reject,
    )
