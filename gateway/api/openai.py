"""The OpenAI-compatible API: /v1/chat/completions, completions, embeddings, images, models.

One request flows one way, a stage a line in ``_pipeline``: read the body → authenticate →
validate → plan the route → reserve limits (the one Redis round trip) → dispatch (the
dispatcher tries the candidates) → relay the answer. Its end (settle, usage record, access line,
metrics) is ``V1Call.end`` (``api/request_end.py``). Streams are relayed event by event as they
arrive; a failure after the first byte ends the stream with an SSE ``error`` event, never a
clean ``[DONE]``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.auth import Principal
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import (
    JSON,
    error_response,
    json_response,
    read_body,
)
from gateway.api.request_end import ClosingStreamingResponse, V1Call, durable
from gateway.api.strict_json import parse_json_object
from gateway.api.validation import (
    validate_chat,
    validate_completion,
    validate_embedding,
    validate_image,
)
from gateway.errors import GatewayError, RateLimited, ServiceUnavailable, UpstreamError
from gateway.metering.accounting import Accounting, produced_tokens
from gateway.metering.gate import usage_from
from gateway.providers.base import UpstreamResponse, UpstreamStream
from gateway.redact import redact
from gateway.routing.dispatch import AttemptRecord, DispatchResult
from gateway.routing.policy import Policy
from gateway.routing.router import Candidate, RoutePlan
from gateway.server.exchange import CLIENT_GONE
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


def allowed_models(principal: Principal, policy: Policy) -> frozenset[str] | None:
    """The key's allow-list in canonical model names (aliases resolved); None = all."""
    models = principal.record.models
    if models is None:
        return None
    return frozenset(policy.resolve_model(name) or name for name in models)


def route_headers(
    plan: RoutePlan,
    served: Candidate,
    attempts: list[AttemptRecord] | None = None,
    route_note: str | None = None,
) -> dict[str, str]:
    route = plan.header_value(served)
    if route_note:  # which replica of a fleet served, and why
        route += "; " + "".join(c if " " <= c <= "~" else "?" for c in route_note[:200])
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
    call = V1Call(request, services, operation.route)
    response: Response | None = None
    try:
        response = await _pipeline(call, operation)
    except GatewayError as exc:
        response = _refused(call, exc)
    except ClientDisconnect:
        call.outcome.status = CLIENT_GONE
        raise
    except Exception:  # a bug: the exchange middleware answers with the catch-all 500
        call.outcome.status = 500
        raise
    finally:
        # A stream ends in its relay; any other request ends here, answered or not.
        recorded = None if call.streaming else call.end()
    await durable(recorded)  # the answer leaves once its usage record is durable
    return response


async def _pipeline(call: V1Call, operation: Operation) -> Response:
    body = await read_body(call.request, call.services.settings.max_body_bytes)
    principal = await _authenticate(call)
    raw = _validate(body, operation)  # after auth: strangers learn nothing of the schema
    plan = _plan(call, raw, principal)
    await _reserve(call, raw, principal, plan)
    if operation.streamable and raw.get("stream") is True:
        return await _stream(call, operation, raw, plan)  # dispatch, then relay event by event
    result = await call.services.dispatcher.run(plan, _json_attempt(call, operation, raw))
    return _answer(call, plan, result)


async def _authenticate(call: V1Call) -> Principal:
    principal = await call.services.auth.authenticate(call.request.headers.get("authorization"))
    call.outcome.key_id = principal.key_id
    return principal


def _validate(body: bytes, operation: Operation) -> dict[str, Any]:
    raw = parse_json_object(body)
    operation.validate(raw)
    return raw


def _plan(call: V1Call, raw: dict[str, Any], principal: Principal) -> RoutePlan:
    """The ordered candidates; the request's books open here (from now on it leaves a usage
    event, failed or not)."""
    policies = call.services.policies
    if not policies.loaded:
        raise ServiceUnavailable("no routing policy is loaded", code="policy_not_loaded")
    plan = call.services.router.plan(
        body=raw,
        headers=call.request.headers,
        key_id=principal.key_id,
        allowed_models=allowed_models(principal, policies.current.policy),
    )
    outcome = call.outcome
    outcome.task, outcome.strategy = plan.task, plan.strategy
    call.books = Accounting(
        record_id=uuid.uuid4().hex,
        key_id=principal.key_id,
        team=principal.record.team or "",
        route=call.route,
        started=outcome.started,
        plan=plan,
        policy=plan.policy or policies.current.policy,
    )
    outcome.record_id = call.books.record_id
    call.headers[USAGE_ID_HEADER] = call.books.record_id
    return plan


async def _reserve(
    call: V1Call, raw: dict[str, Any], principal: Principal, plan: RoutePlan
) -> None:
    """The key's limits for the request's worst case: the one Redis round trip before the
    upstream call."""
    books = call.books
    assert books is not None and books.policy is not None
    books.reservation, books.estimate = await call.services.gate.reserve(
        principal, plan, raw, books.policy, books.record_id, call.route
    )
    if books.reservation is not None:
        call.headers.update(books.reservation.headers)


def _served(call: V1Call, plan: RoutePlan, result: DispatchResult[Any]) -> Candidate:
    """Note who served, after how many tries, and the time the gateway itself took."""
    served: Candidate = result.candidate
    books, services = call.books, call.services
    assert books is not None
    books.served_model, books.served_provider = served.model, served.provider
    books.attempts = len(result.attempts)
    call.outcome.note_dispatch(services, plan, result.attempts, served)
    call.headers.update(route_headers(plan, served, result.attempts, result.value.route_note))
    upstream_s = sum(attempt.duration_s for attempt in result.attempts)
    elapsed = time.perf_counter() - call.outcome.started
    services.metrics.overhead.labels(call.route).observe(max(elapsed - upstream_s, 0.0))
    return served


def _answer(call: V1Call, plan: RoutePlan, result: DispatchResult[UpstreamResponse]) -> Response:
    _served(call, plan, result)
    upstream = result.value
    call.outcome.usage = usage_from(upstream.data)
    return Response(upstream.body, status_code=200, headers=call.headers, media_type=JSON)


def _refused(call: V1Call, exc: GatewayError) -> Response:
    """The client's error envelope, and what the failure tells the metrics and the books."""
    outcome, metrics = call.outcome, call.services.metrics
    outcome.status = exc.status
    if isinstance(exc, UpstreamError) and exc.provider and outcome.provider is None:
        outcome.provider = exc.provider
        metrics.upstream_errors.labels(exc.provider, exc.kind).inc()
    failed_attempts = getattr(exc, "attempts", None)
    if failed_attempts:
        outcome.note_dispatch(call.services, None, failed_attempts, None)
    if isinstance(exc, RateLimited):
        metrics.rate_limited.labels(exc.code or "rate_limit_exceeded").inc()
    if call.books is not None:
        call.books.attempts = len(failed_attempts or ())
    return error_response(exc, call.headers)


def _json_attempt(
    call: V1Call, operation: Operation, body: dict[str, Any]
) -> Callable[[Candidate], Awaitable[UpstreamResponse]]:
    services, receive = call.services, call.request.receive
    assert call.books is not None and call.books.policy is not None
    policy = call.books.policy

    async def attempt(candidate: Candidate) -> UpstreamResponse:
        provider = services.providers.get(candidate.provider, policy.providers[candidate.provider])
        upstream_body = {**body, "model": candidate.upstream_model}
        # A provider that works long before answering (the local engine) stops when the
        # client hangs up.
        return await provider.post_json(operation.upstream_path, upstream_body, client_gone=receive)

    return attempt


async def _stream(
    call: V1Call, operation: Operation, body: dict[str, Any], plan: RoutePlan
) -> Response:
    services, outcome, books = call.services, call.outcome, call.books
    assert books is not None and books.policy is not None
    policy = books.policy
    outcome.stream = books.streamed = True
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
    served = _served(call, plan, result)
    call.headers.update(SSE_HEADERS)
    upstream: UpstreamStream = result.value

    async def relay() -> AsyncGenerator[bytes, None]:
        error: str | None = None
        last: bytes | None = None  # [DONE] or the error event: sent once the books are closed
        outcome.status = 499  # until the stream completes: the client went away
        try:
            yield b""  # where a body that is never relayed stops (ClosingStreamingResponse)
            async for data in upstream.events():
                if books.ttft_ms is None:
                    ttft_s = time.perf_counter() - outcome.started
                    books.ttft_ms = int(ttft_s * 1000)
                    services.metrics.ttft.labels(served.model).observe(ttft_s)
                if data == b"[DONE]":
                    outcome.status = 200
                    result.succeeded()  # a clean end: only now a success for breaker and latency
                    last = DONE
                    break
                chunk: Any = None
                with contextlib.suppress(orjson.JSONDecodeError):
                    chunk = orjson.loads(data)
                books.streamed_chunks += produced_tokens(chunk)
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
            last = sse_error(exc)
        finally:
            # However it ends (done, cut, or the client gone): upstream closed, the provider
            # slot given back (no verdict when the client went away), then the request's end.
            upstream.close()
            result.release()
            recorded = call.end(error)
        await durable(recorded)  # the client sees the end of the stream once it is recorded
        if last is not None:
            yield last

    response = await ClosingStreamingResponse.started(
        relay(), status_code=200, headers=call.headers, media_type="text/event-stream"
    )
    call.streaming = True
    return response


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
