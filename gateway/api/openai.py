"""The OpenAI-compatible API: /v1/chat/completions, completions, embeddings, images, models.

One request flows one way: read the body → authenticate → validate → plan the route → reserve
limits (the one Redis round trip) → dispatcher tries candidates → relay the answer → settle and
log. Streams are relayed event by event as they arrive; a failure after the first byte ends the
stream with an SSE ``error`` event, never a clean ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.access.auth import Principal
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import (
    JSON,
    error_response,
    json_response,
    read_body,
)
from gateway.api.strict_json import parse_json_object
from gateway.api.validation import (
    validate_chat,
    validate_completion,
    validate_embedding,
    validate_image,
)
from gateway.errors import GatewayError, RateLimited, ServiceUnavailable, UpstreamError
from gateway.metering.accounting import Accounting, produced_tokens
from gateway.metering.gate import Usage, usage_from
from gateway.providers.base import UpstreamResponse, UpstreamStream
from gateway.redact import redact
from gateway.routing.dispatch import AttemptRecord
from gateway.routing.policy import Policy
from gateway.routing.router import Candidate, RoutePlan
from gateway.server.exchange import CLIENT_GONE, request_id_of, when_answered
from gateway.services import Services

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
DONE = b"data: [DONE]\n\n"
# The usage event's id (gateway-made, so a client cannot replay one to dodge its charges).
USAGE_ID_HEADER = "x-switchyard-usage-id"


@dataclass(frozen=True)
class Operation:
    route: str
    upstream_path: str
    validate: Callable[[dict[str, Any]], None]
    streamable: bool


CHAT = Operation("chat.completions", "/chat/completions", validate_chat, True)
COMPLETIONS = Operation("completions", "/completions", validate_completion, True)
EMBEDDINGS = Operation("embeddings", "/embeddings", validate_embedding, False)
IMAGES = Operation("images.generations", "/images/generations", validate_image, False)


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


def allowed_models(principal: Principal, policy: Policy) -> frozenset[str] | None:
    """The key's allow-list in canonical model names (aliases resolved); None = all."""
    models = principal.record.models
    if models is None:
        return None
    return frozenset(policy.resolve_model(name) or name for name in models)


def route_headers(
    plan: RoutePlan, served: Candidate, attempts: list[AttemptRecord] | None = None
) -> dict[str, str]:
    route = plan.header_value(served)
    for record in attempts or ():  # a local engine passed over (not loaded, unhealthy): why
        if record.outcome == "skipped" and record.kind == "unavailable":
            why = "".join(c if " " <= c <= "~" else "?" for c in redact(record.detail, limit=160))
            route += f"; skipped {record.model}: {why}"
    return {
        "x-switchyard-model": served.model,
        "x-switchyard-provider": served.provider,
        "x-switchyard-route": route,
    }


def sse_error(error: GatewayError) -> bytes:
    return b"event: error\ndata: " + error.body_bytes() + b"\n\n"


async def _handle(request: Request, services: Services, operation: Operation) -> Response:
    outcome = Outcome(request_id_of(request))
    headers: dict[str, str] = {}
    accounting: Accounting | None = None
    streaming_started = False
    try:
        body_bytes = await read_body(request, services.settings.max_body_bytes)
        principal = await services.auth.authenticate(request.headers.get("authorization"))
        outcome.key_id = principal.key_id
        raw = parse_json_object(body_bytes)  # after auth: strangers learn nothing of the schema
        operation.validate(raw)
        if not services.policies.loaded:
            raise ServiceUnavailable("no routing policy is loaded", code="policy_not_loaded")
        plan = services.router.plan(
            body=raw,
            headers=request.headers,
            key_id=principal.key_id,
            allowed_models=allowed_models(principal, services.policies.current.policy),
        )
        outcome.task, outcome.strategy = plan.task, plan.strategy
        accounting = Accounting(
            record_id=uuid.uuid4().hex,
            key_id=principal.key_id,
            team=principal.record.team or "",
            route=operation.route,
            started=outcome.started,
            plan=plan,
            policy=plan.policy or services.policies.current.policy,
        )
        outcome.record_id = accounting.record_id
        headers[USAGE_ID_HEADER] = accounting.record_id
        accounting.reservation, accounting.estimate = await services.gate.reserve(
            principal, plan, raw, accounting.policy, accounting.record_id, operation.route
        )
        if accounting.reservation is not None:
            headers.update(accounting.reservation.headers)
        if operation.streamable and raw.get("stream") is True:
            outcome.stream = accounting.streamed = True
            response = await _stream(services, operation, raw, plan, accounting, headers, outcome)
            streaming_started = True
            return response
        result = await services.dispatcher.run(
            plan, _json_attempt(services, operation, raw, accounting.policy, request.receive)
        )
        served: Candidate = result.candidate
        upstream: UpstreamResponse = result.value
        accounting.served_model, accounting.served_provider = served.model, served.provider
        accounting.attempts = len(result.attempts)
        outcome.note_dispatch(services, plan, result.attempts, served)
        outcome.usage = usage_from(upstream.data)
        headers.update(route_headers(plan, served, result.attempts))
        upstream_s = sum(attempt.duration_s for attempt in result.attempts)
        elapsed = time.perf_counter() - outcome.started
        services.metrics.overhead.labels(operation.route).observe(max(elapsed - upstream_s, 0.0))
        await _durable(services.accountant.close(accounting, outcome.status, outcome.usage))
        return Response(upstream.body, status_code=200, headers=headers, media_type=JSON)
    except GatewayError as exc:
        outcome.status = exc.status
        if isinstance(exc, UpstreamError) and exc.provider and outcome.provider is None:
            outcome.provider = exc.provider
            services.metrics.upstream_errors.labels(exc.provider, exc.kind).inc()
        failed_attempts = getattr(exc, "attempts", None)
        if failed_attempts:
            outcome.note_dispatch(services, None, failed_attempts, None)
        if isinstance(exc, RateLimited):
            services.metrics.rate_limited.labels(exc.code or "rate_limit_exceeded").inc()
        if accounting is not None:
            accounting.attempts = len(failed_attempts or ())
            await _durable(services.accountant.close(accounting, outcome.status, outcome.usage))
        return error_response(exc, headers)
    except ClientDisconnect:
        outcome.status = CLIENT_GONE
        raise
    except Exception:  # a bug: the exchange middleware answers with the catch-all 500
        outcome.status = 500
        raise
    finally:
        if not streaming_started:
            if accounting is not None:
                services.accountant.close(accounting, outcome.status, outcome.usage)
            # The line is written once the status line is out, with the status the client got.
            when_answered(
                request,
                lambda status: outcome.finish(services, operation.route, status=status),
                outcome.status,
            )


async def _durable(recorded: asyncio.Future[None] | None) -> None:
    """Wait until the usage record is in Redis or fsync'ed to the spool: a gateway killed
    after this loses nothing that was answered."""
    if recorded is not None:
        await recorded


class ClosingStreamingResponse(StreamingResponse):
    """Closes the body generator when the response ends, however it ends. Starlette leaves a
    generator that was cancelled at a ``yield`` (client gone) to the garbage collector; its
    ``finally`` (close upstream, record partial usage) must run now. ``on_close`` runs last:
    a generator that never started (the client left before the first chunk; on ASGI < 2.4
    Starlette then cancels the sender) has no ``finally`` to run."""

    def __init__(
        self, content: Any, *, on_close: Callable[[], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
            if self._on_close is not None:
                self._on_close()


def _json_attempt(
    services: Services,
    operation: Operation,
    body: dict[str, Any],
    policy: Policy,
    receive: Callable[[], Awaitable[Any]],
) -> Callable[[Candidate], Any]:
    async def attempt(candidate: Candidate) -> UpstreamResponse:
        provider = services.providers.get(candidate.provider, policy.providers[candidate.provider])
        upstream_body = {**body, "model": candidate.upstream_model}
        # A provider that works long before answering (the local engine) stops when the
        # client hangs up.
        return await provider.post_json(operation.upstream_path, upstream_body, client_gone=receive)

    return attempt


async def _stream(
    services: Services,
    operation: Operation,
    body: dict[str, Any],
    plan: RoutePlan,
    accounting: Accounting,
    headers: dict[str, str],
    outcome: Outcome,
) -> Response:
    policy = accounting.policy
    assert policy is not None
    options = body.get("stream_options") or {}
    client_wants_usage = options.get("include_usage") is True
    # Upstream always reports usage so that limits and usage records are exact.
    upstream_options = {**options, "include_usage": True}

    async def attempt(candidate: Candidate) -> UpstreamStream:
        provider = services.providers.get(candidate.provider, policy.providers[candidate.provider])
        upstream_body = {
            **body,
            "model": candidate.upstream_model,
            "stream": True,
            "stream_options": upstream_options,
        }
        return await provider.open_stream(operation.upstream_path, upstream_body)

    result = await services.dispatcher.run(plan, attempt, hold=True)
    served: Candidate = result.candidate
    accounting.served_model, accounting.served_provider = served.model, served.provider
    accounting.attempts = len(result.attempts)
    outcome.note_dispatch(services, plan, result.attempts, served)
    headers.update(route_headers(plan, served, result.attempts))
    headers.update(SSE_HEADERS)
    upstream: UpstreamStream = result.value
    to_headers = time.perf_counter() - outcome.started
    upstream_s = sum(attempt.duration_s for attempt in result.attempts)
    services.metrics.overhead.labels(operation.route).observe(max(to_headers - upstream_s, 0.0))

    stream_ended = False

    def end_stream(error: str | None) -> None:
        """Once, however the stream ends: upstream, provider slot, usage record, access log."""
        nonlocal stream_ended
        if stream_ended:
            return
        stream_ended = True
        upstream.close()
        result.release()  # no verdict yet (the client went away): neither way
        services.accountant.close(accounting, outcome.status, outcome.usage)
        outcome.finish(services, operation.route, error)

    def never_relayed() -> None:
        if not stream_ended:  # the client left before the relay started: its finally never ran
            outcome.status = 499
            end_stream(None)

    async def relay() -> AsyncIterator[bytes]:
        error: str | None = None
        outcome.status = 499  # until the stream completes: the client went away
        try:
            async for data in upstream.events():
                if accounting.ttft_ms is None:
                    ttft_s = time.perf_counter() - outcome.started
                    accounting.ttft_ms = int(ttft_s * 1000)
                    services.metrics.ttft.labels(served.model).observe(ttft_s)
                if data == b"[DONE]":
                    outcome.status = 200
                    result.succeeded()  # a clean end: only now a success for breaker and latency
                    # Recorded before the client sees the end of the stream.
                    await _durable(
                        services.accountant.close(accounting, outcome.status, outcome.usage)
                    )
                    yield DONE
                    return
                chunk: Any = None
                with contextlib.suppress(orjson.JSONDecodeError):
                    chunk = orjson.loads(data)
                accounting.streamed_chunks += produced_tokens(chunk)
                usage = usage_from(chunk)
                if usage is not None:
                    outcome.usage = usage
                    if not client_wants_usage and not chunk.get("choices"):
                        continue  # the usage-only chunk the client did not ask for
                yield b"data: " + data + b"\n\n"
        except UpstreamError as exc:
            outcome.status = exc.status
            error = exc.message
            services.metrics.upstream_errors.labels(served.provider, exc.kind).inc()
            # Too late to fall back, but the breaker must see it: a provider that always cuts
            # its streams would otherwise stay in rotation.
            result.failed()
            yield sse_error(exc)
        finally:
            end_stream(error)

    return ClosingStreamingResponse(
        relay(),
        on_close=never_relayed,
        status_code=200,
        headers=headers,
        media_type="text/event-stream",
    )


async def chat_completions(request: Request, services: Services) -> Response:
    return await _handle(request, services, CHAT)


async def completions(request: Request, services: Services) -> Response:
    return await _handle(request, services, COMPLETIONS)


async def embeddings(request: Request, services: Services) -> Response:
    return await _handle(request, services, EMBEDDINGS)


async def image_generations(request: Request, services: Services) -> Response:
    return await _handle(request, services, IMAGES)


async def list_models(request: Request, services: Services) -> Response:
    """``GET /v1/models``: the policy's models and aliases that the caller's key may use."""
    try:
        principal = await services.auth.authenticate(request.headers.get("authorization"))
        if not services.policies.loaded:
            raise ServiceUnavailable("no routing policy is loaded", code="policy_not_loaded")
        policy = services.policies.current.policy
        allowed = allowed_models(principal, policy)
        data = []
        for name, config in policy.models.items():
            if allowed is None or name in allowed:
                entry = {"id": name, "object": "model", "created": 0, "owned_by": config.provider}
                # A random-weight smoke-test checkpoint says so plainly.
                provider = services.providers.get(
                    config.provider, policy.providers[config.provider]
                )
                note = provider.model_note()
                if note or config.description:
                    entry["description"] = note or config.description
                data.append(entry)
        for alias, target in policy.aliases.items():
            if allowed is None or target in allowed:
                owner = policy.models[target].provider
                data.append({"id": alias, "object": "model", "created": 0, "owned_by": owner})
        return json_response({"object": "list", "data": data})
    except GatewayError as exc:
        return error_response(exc)


# Guard.NONE: each pipeline authenticates as one of its stages, so that its errors are in the
# client's format.
routes = [
    Route("/v1/chat/completions", endpoint(chat_completions, Guard.NONE), methods=["POST"]),
    Route("/v1/completions", endpoint(completions, Guard.NONE), methods=["POST"]),
    Route("/v1/embeddings", endpoint(embeddings, Guard.NONE), methods=["POST"]),
    Route("/v1/images/generations", endpoint(image_generations, Guard.NONE), methods=["POST"]),
    Route("/v1/models", endpoint(list_models, Guard.NONE), methods=["GET"]),
]
