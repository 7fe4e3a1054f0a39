"""The end of a /v1 request, written once: ``V1Call.end``.

A request that reached routing has books (``metering.accounting.Accounting``); at its end they
are closed (the limiter's settle and the usage record, submitted to the settle batch: the
future returned resolves once the record is durable), and its access log line and request
metrics are written. ``end`` is called from one place for a JSON answer (the handler's
``finally``) and one place for a stream (the relay's ``finally``); the caller awaits the future
before the answer's last byte, or before ``[DONE]``, goes out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from gateway.cache import BYPASS, CACHE_HEADER
from gateway.formats.internal import Usage
from gateway.metering.accounting import Accounting
from gateway.metering.attribution import NOBODY
from gateway.routing.dispatch import AttemptRecord
from gateway.routing.router import Candidate, RoutePlan
from gateway.server.exchange import request_id_of, when_answered
from gateway.services import Services
from gateway.tracing import NO_ATTEMPT, AttemptTrace
from gateway.tracing.genai import INPUT_TOKENS, OUTPUT_TOKENS, RESPONSE_MODEL


class Outcome:
    """What the access log line and the metrics say about one request."""

    __slots__ = (
        "attempts",
        "key_id",
        "model",
        "provider",
        "record_id",
        "request_id",
        "route_reason",
        "started",
        "status",
        "strategy",
        "stream",
        "task",
        "usage",
    )

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.started = time.perf_counter()
        self.key_id: str | None = None
        self.record_id: str | None = None
        self.model: str | None = None
        self.provider: str | None = None
        self.status = 200
        self.stream = False
        self.usage: Usage | None = None
        self.task: str | None = None
        self.strategy: str | None = None
        self.route_reason: str | None = None
        self.attempts = 0

    def note_dispatch(
        self,
        services: Services,
        plan: RoutePlan | None,
        attempts: list[AttemptRecord],
        served: Candidate | None,
    ) -> None:
        """Count every try (ok, failed, skipped) and note which candidate served and why."""
        self.attempts = len(attempts)
        counter = services.metrics.upstream_attempts
        for record in attempts:
            counter.labels(record.provider, record.model, record.outcome).inc()
        if served is None:
            return
        self.model, self.provider, self.route_reason = served.model, served.provider, served.reason
        if plan is not None and plan.candidates and plan.candidates[0].model != served.model:
            services.metrics.fallbacks.labels(plan.candidates[0].model, served.model).inc()

    def finish(
        self, services: Services, route: str, error: str | None = None, status: int | None = None
    ) -> None:
        """One access log line and the request metrics; ``status`` is the one the client got
        when it is known to differ from the outcome's own (the exchange reports it)."""
        if status is not None:
            self.status = status
            error = error or ("failed" if status >= 400 else None)
        elapsed = time.perf_counter() - self.started
        metrics = services.metrics
        metrics.requests.labels(
            route, self.model or "-", self.provider or "-", str(self.status)
        ).inc()
        metrics.latency.labels(route).observe(elapsed)
        if services.settings.access_log:
            services.log.info(
                "request",
                request_id=self.request_id,
                usage_id=self.record_id,
                route=route,
                key_id=self.key_id,
                model=self.model,
                provider=self.provider,
                status=self.status,
                stream=self.stream,
                task=self.task,
                strategy=self.strategy,
                route_reason=self.route_reason,
                attempts=self.attempts,
                latency_ms=round(elapsed * 1000, 3),
                prompt_tokens=self.usage.prompt_tokens if self.usage else None,
                completion_tokens=self.usage.completion_tokens if self.usage else None,
                error=error,
            )


class V1Call:
    """One /v1 request on its way through the pipeline: what it has learnt so far (outcome,
    books, the headers of its answer) and its end."""

    def __init__(self, request: Request, services: Services, route: str) -> None:
        self.request = request
        self.services = services
        self.route = route
        self.outcome = Outcome(request_id_of(request))
        self.books: Accounting | None = None  # opened once the request is routed
        self.attribution = NOBODY  # the end user and tags, once the body is read
        # Every answer says whether the cache served it (api/caching.py changes it).
        self.headers: dict[str, str] = {CACHE_HEADER: BYPASS}
        self.streaming = False  # a stream's relay ends it, not the handler
        # Its span (a shared no-op unless tracing is on): stages and upstream tries hang on it.
        self.trace = services.tracing.start_request(
            route=route, method=request.method, path=request.scope["path"], headers=request.headers
        )
        self.tries = 0  # upstream tries so far (the number of each try's span)
        self.held_try: AttemptTrace = NO_ATTEMPT  # the try whose stream is being relayed

    def end(self, error: str | None = None) -> asyncio.Future[None] | None:
        """Close the books and write the access line and metrics; returns the future of the
        usage record's durability (None: nothing to record). A stream's line is written now;
        an answer's once its status line is out, with the status the client got."""
        outcome, services = self.outcome, self.services
        recorded = None
        if self.books is not None and services.tracing.enabled:
            recorded = self._traced_close(self.books)
        elif self.books is not None:
            recorded = services.accountant.close(self.books, outcome.status, outcome.usage)
        if services.tracing.enabled:
            self._trace_end()
        if self.streaming:
            outcome.finish(services, self.route, error)
        else:
            when_answered(
                self.request,
                lambda status: outcome.finish(services, self.route, status=status),
                outcome.status,
            )
        return recorded

    def _traced_close(self, books: Accounting) -> asyncio.Future[None] | None:
        """``close`` in a ``usage_record`` span that lasts until the record is durable."""
        outcome = self.outcome
        stage = self.trace.stage("usage_record").__enter__()
        recorded = self.services.accountant.close(books, outcome.status, outcome.usage)
        if recorded is None:
            stage.__exit__(None, None, None)
        else:
            recorded.add_done_callback(lambda _: stage.__exit__(None, None, None))
        return recorded

    def _trace_end(self) -> None:
        outcome, trace = self.outcome, self.trace
        trace.set("switchyard.cache", self.headers.get(CACHE_HEADER, BYPASS))
        if outcome.key_id is not None:
            trace.set("switchyard.key_id", outcome.key_id)
        if outcome.model is not None:
            trace.set("switchyard.model", outcome.model)
        if self.books is not None and self.books.served_model is not None:
            trace.set(RESPONSE_MODEL, self.books.served_model)
        if outcome.usage is not None:
            trace.set(INPUT_TOKENS, outcome.usage.prompt_tokens)
            trace.set(OUTPUT_TOKENS, outcome.usage.completion_tokens)
        trace.end(outcome.status)


async def durable(recorded: asyncio.Future[None] | None) -> None:
    """Wait until the usage record is in Redis or fsync'ed to the spool: a gateway killed
    after this loses nothing that was answered."""
    if recorded is not None:
        await recorded


class ClosingStreamingResponse(StreamingResponse):
    """A stream whose body has started before the response is sent, and is closed when the
    response ends, however it ends: so the body's ``finally`` (the request's end) always runs.

    Started: a body Starlette never iterates (the client left before the first chunk; on
    ASGI < 2.4 Starlette then cancels the sender) stops at its first ``yield``. Closed:
    Starlette leaves a body cancelled at a ``yield`` (client gone) to the garbage collector.
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
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
