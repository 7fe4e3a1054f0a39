"""A /v1 request from its opening to its end, the end written and called once.

``Calls.open`` opens a request's books (``metering.accounting.Accounting``: from the first
byte, never missing) and its span. The pipeline answers with a ``Reply``: a whole answer (JSON,
an error envelope, a cached answer) or a stream relayed event by event (``stream.py``).
``Calls.deliver`` sends a stream's pieces but the last, then the request's end (the books
closed: the limiter's settle and the usage record, submitted to the settle batch; the span
ended), then, once the usage record is durable, the last piece: its end or its error event. A
whole answer is ended the same way before its first byte, and sent once its usage record is
durable. The access line and request metrics follow the last byte (the exchange's end). A
request that failed on a bug ends the same way before the error goes on up (the exchange
middleware answers the catch-all 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from gateway.api.http import JSON
from gateway.cache import CACHE_HEADER
from gateway.formats.internal import Usage
from gateway.metering.accounting import Accountant, Accounting
from gateway.metrics import Metrics
from gateway.server.exchange import request_id_of, when_answered
from gateway.server.header_map import header_map
from gateway.tracing import RequestTrace, Tracing
from gateway.tracing.genai import INPUT_TOKENS, OUTPUT_TOKENS, RESPONSE_MODEL

# The usage event's id (gateway-made, so a client cannot replay one to dodge its charges).
USAGE_ID_HEADER = "x-switchyard-usage-id"


@dataclass(frozen=True, slots=True)
class Call:
    """One /v1 request on its way: the request, its books and its span."""

    request: Request
    books: Accounting
    trace: RequestTrace


class Reply:
    """What a /v1 request answers: its status and headers, its body (``last``: a whole
    answer's body, or what a stream sends last), the usage it is charged for (None: the
    estimate) and, for the access line, what went wrong and at which provider."""

    relayed = False  # a stream, relayed as it arrives: its ``pieces`` first

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        body: bytes = b"",
        media_type: str = JSON,
        *,
        usage: Usage | None = None,
        provider: str | None = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.last = body
        self.media_type = media_type
        self.usage = usage
        self.provider = provider
        self.error: str | None = None

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body before its last piece: none for a whole answer."""
        return
        yield

    def raise_failure(self) -> None:
        """Raise what stopped a whole answer, if anything did (``Failed``)."""

    def close(self) -> None:
        """However the answer ended: what it holds given back."""


class Failed(Reply):
    """A request that failed with no ``GatewayError`` (a bug; the client gone while its body
    was read): it ends like any other, then the error goes on up."""

    def __init__(self, status: int, error: BaseException) -> None:
        super().__init__(status, {})
        self.exception = error

    def raise_failure(self) -> None:
        raise self.exception


def answer_headers(books: Accounting) -> dict[str, str]:
    """What every answer says of its request's books: whether the cache served it, the
    usage event's id (once routed) and the key's limits (once reserved)."""
    headers = {CACHE_HEADER: books.cache}
    if books.routed:
        headers[USAGE_ID_HEADER] = books.record_id
    if books.reservation is not None:
        headers.update(books.reservation.headers)
    return headers


class Calls:
    """Opens each /v1 request and ends it: its books, its span, its access line."""

    def __init__(
        self,
        accountant: Accountant,
        metrics: Metrics,
        log: Any,
        tracing: Tracing,
        *,
        access_log: bool,
    ) -> None:
        self.accountant = accountant
        self.metrics = metrics
        self.log = log
        self.tracing = tracing
        self.access_log = access_log

    def open(self, request: Request, route: str) -> Call:
        # Its span (a shared no-op unless tracing is on): stages and upstream tries hang on it.
        trace = self.tracing.start_request(
            route=route,
            method=request.method,
            path=request.scope["path"],
            headers=header_map(request.scope),
        )
        return Call(request, Accounting(route=route, started=time.perf_counter()), trace)

    async def deliver(self, call: Call, reply: Reply) -> Response:
        """``reply`` as the response, and the request's end: between a stream's last two
        pieces, before a whole answer's first byte (without the stream's generators, which
        cost a JSON answer about 2 µs: docs/benchmarks.md)."""
        if reply.relayed:
            return await ClosingStreamingResponse.started(
                self._ended(call, reply),
                status_code=200,
                headers=reply.headers,
                media_type="text/event-stream",
            )
        try:
            reply.raise_failure()
        finally:
            reply.close()
            recorded = self._end(call, reply)
        await durable(recorded)  # the answer leaves once its usage record is durable
        return Response(
            reply.last, status_code=reply.status, headers=reply.headers, media_type=reply.media_type
        )

    async def _ended(self, call: Call, reply: Reply) -> AsyncGenerator[bytes, None]:
        try:
            yield b""  # where a body that is never relayed stops (ClosingStreamingResponse)
            async with contextlib.aclosing(reply.pieces()) as pieces:
                async for piece in pieces:
                    yield piece
        finally:
            # However it ended (done, refused, cut, the client gone): what the reply holds
            # given back, then the request's end.
            reply.close()
            recorded = self._end(call, reply)
        await durable(recorded)  # the last piece leaves once the usage record is durable
        if reply.last:
            yield reply.last

    def _end(self, call: Call, reply: Reply) -> asyncio.Future[None] | None:
        """Close the books; returns the future of the usage record's durability (None: nothing
        to record). The access line and metrics are written once the answer's last byte is out
        (the exchange's end): a whole answer's with the status the client got, a stream's
        with how it ended."""
        books = call.books
        if books.routed and self.tracing.enabled:
            recorded = self._traced_close(call, reply)
        else:
            recorded = self.accountant.close(books, reply.status, reply.usage)
        if self.tracing.enabled:
            _trace_end(call, reply)
        if reply.relayed:
            # A stream's status line went out before its outcome was known: the line says how
            # it ended.
            when_answered(
                call.request,
                lambda _: self._access_line(call, reply, reply.status, reply.error),
                reply.status,
            )
        else:
            when_answered(
                call.request,
                lambda status: self._access_line(
                    call, reply, status, "failed" if status >= 400 else None
                ),
                reply.status,
            )
        return recorded

    def _traced_close(self, call: Call, reply: Reply) -> asyncio.Future[None] | None:
        """``close`` in a ``usage_record`` span that lasts until the record is durable."""
        stage = call.trace.stage("usage_record").__enter__()
        recorded = self.accountant.close(call.books, reply.status, reply.usage)
        if recorded is None:
            stage.__exit__(None, None, None)
        else:
            recorded.add_done_callback(lambda _: stage.__exit__(None, None, None))
        return recorded

    def _access_line(self, call: Call, reply: Reply, status: int, error: str | None) -> None:
        """One access log line and the request metrics, with ``status`` as the client got it."""
        books, usage = call.books, reply.usage
        model, provider = books.served_model, books.served_provider or reply.provider
        elapsed = time.perf_counter() - books.started
        metrics = self.metrics
        metrics.requests.labels(books.route, model or "-", provider or "-", str(status)).inc()
        metrics.latency.labels(books.route).observe(elapsed)
        if not self.access_log:
            return
        plan = books.plan
        self.log.info(
            "request",
            request_id=request_id_of(call.request),
            usage_id=books.record_id if plan is not None else None,
            route=books.route,
            key_id=books.key_id,
            model=model,
            provider=provider,
            status=status,
            stream=books.streamed,
            task=plan.task if plan is not None else None,
            strategy=plan.strategy if plan is not None else None,
            route_reason=books.route_reason,
            attempts=books.attempts,
            latency_ms=round(elapsed * 1000, 3),
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            error=error,
        )


def _trace_end(call: Call, reply: Reply) -> None:
    books, trace, usage = call.books, call.trace, reply.usage
    trace.set("switchyard.cache", books.cache)
    if books.key_id is not None:
        trace.set("switchyard.key_id", books.key_id)
    if books.served_model is not None:
        trace.set("switchyard.model", books.served_model)
        trace.set(RESPONSE_MODEL, books.served_model)
    if usage is not None:
        trace.set(INPUT_TOKENS, usage.prompt_tokens)
        trace.set(OUTPUT_TOKENS, usage.completion_tokens)
    trace.end(reply.status)


async def durable(recorded: asyncio.Future[None] | None) -> None:
    """Wait until the usage record is in Redis or fsync'ed to the spool: a gateway killed
    after this loses nothing that was answered."""
    if recorded is not None:
        await recorded


class ClosingStreamingResponse(StreamingResponse):
    """A stream whose body has started before the response is sent, and is closed when the
    response ends, however it ends: so the body's ``finally`` (the request's end) always runs.

    Started: a body never iterated (the client left before the first chunk, and the watcher
    cancelled the sender) stops at its first ``yield``. Closed: a body cancelled at a ``yield``
    (client gone) is not left to the garbage collector.
    """

    @classmethod
    async def started(
        cls, body: AsyncGenerator[bytes, None], **kwargs: Any
    ) -> ClosingStreamingResponse:
        """``body`` first yields ``b""`` (taken here: nothing is sent of it)."""
        await anext(body)
        return cls(body, **kwargs)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            if scope["type"] == "http":
                await self._relay(receive, send)
            else:
                await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()

    async def _relay(self, receive: Any, send: Any) -> None:
        """The body sent from this task while a watcher waits for ``http.disconnect`` and
        cancels it. Starlette does the opposite on ASGI < 2.4 (the body from a new task, the
        watch in this one), which costs every stream a loop turn before its first byte: on a
        busy loop, a whole round of the other requests' work."""
        relaying = asyncio.current_task()
        assert relaying is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            relaying.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            # The client left: the relay stops here. Cancelled from elsewhere too (the server
            # stopping): the cancellation goes on.
            if not gone or relaying.uncancel() > 0:
                raise
        except OSError:  # an ASGI 2.4 server's send to a client gone, as Starlette reads it
            raise ClientDisconnect() from None
        finally:
            watcher.cancel()
        if self.background is not None:
            await self.background()
