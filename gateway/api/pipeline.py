"""The one /v1 pipeline, whatever the front door: a stage a line in ``_pipeline``.

read the body → authenticate (a bearer or ``x-api-key``) → check it at the door → plan the
route → reserve limits (the one Redis round trip) → dispatch (the dispatcher tries the
candidates; each attempt speaks the candidate's format, translated when it is not the
client's) → relay the answer. Its end (settle, usage record, access line, metrics) is
``V1Call.end`` (``api/request_end.py``). The door (``api/doors.py``) decides what differs by
format: the checks, the error envelope, the rendering of answers and streams. Streams are
relayed event by event as they arrive; a failure after the first byte ends the stream with the
client format's error event, never a clean end. Uploads (``api/uploads.py``) share every
stage but the reading of their body.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.access.auth import Principal, client_credential
from gateway.api.caching import (
    SSE_HEADERS,
    CachedRequest,
    StreamKeeper,
    cache_directive,
    cache_plan,
    keep_answer,
    reserve_and_look_up,
    served_from_cache,
)
from gateway.api.doors import Door
from gateway.api.envelopes import error_response, stream_error
from gateway.api.http import JSON, read_body
from gateway.api.request_end import ClosingStreamingResponse, V1Call, durable
from gateway.api.strict_json import parse_json_object
from gateway.api.translation import Answer, Exchange, broken_answer
from gateway.errors import GatewayError, RateLimited, ServiceUnavailable, UpstreamError
from gateway.formats.errors import FormatError
from gateway.formats.internal import FormatName
from gateway.formats.relay import StreamRelay
from gateway.metering.accounting import Accounting
from gateway.metering.attribution import take_attribution
from gateway.metering.gate import Usage
from gateway.providers.base import PhasedStream, Provider, UpstreamStream
from gateway.providers.forwarding import forwarded_headers
from gateway.redact import redact
from gateway.routing.dispatch import AttemptRecord, DispatchResult
from gateway.routing.policy import Policy, ProviderConfig
from gateway.routing.router import Candidate, RoutePlan
from gateway.server.exchange import CLIENT_GONE
from gateway.services import Services
from gateway.tracing import AttemptTrace

# The usage event's id (gateway-made, so a client cannot replay one to dodge its charges).
USAGE_ID_HEADER = "x-switchyard-usage-id"
NOTHING = Usage(0, 0)


@dataclass(frozen=True)
class Served:
    """What an attempt hands back: the JSON answer, or the open stream and its format."""

    answer: Answer | None = None
    stream: UpstreamStream | None = None
    target: FormatName = "openai_chat"
    reply_type: str = JSON
    route_note: str | None = None  # which replica of a fleet served, and why


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
    for record in attempts or ():  # a candidate passed over (not loaded, too long): why
        if record.outcome == "skipped" and record.kind in ("unavailable", "context_window"):
            why = "".join(c if " " <= c <= "~" else "?" for c in redact(record.detail, limit=160))
            route += f"; skipped {record.model}: {why}"
    return {
        "x-switchyard-model": served.model,
        "x-switchyard-provider": served.provider,
        "x-switchyard-route": route,
    }


async def handle(request: Request, services: Services, door: Door) -> Response:
    """A JSON door's request, from its first byte to its end."""
    return await run(request, services, door, lambda call: _pipeline(call, door))


async def run(
    request: Request,
    services: Services,
    door: Door,
    pipeline: Callable[[V1Call], Awaitable[Response]],
) -> Response:
    """``pipeline`` for one request; its refusals in the door's envelope, its end once."""
    call = V1Call(request, services, door.route)
    response: Response | None = None
    try:
        response = await pipeline(call)
    except GatewayError as exc:
        response = refused(call, door, exc)
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


async def _pipeline(call: V1Call, door: Door) -> Response:
    body = await read_body(call.request, call.services.settings.max_body_bytes)
    principal = await authenticate(call)
    raw = parse_json_object(body)  # after auth: strangers learn nothing of the schema
    attribute(call, raw, principal)
    exchange = Exchange(door, raw, door.check(raw))
    call.trace.request(door.route, raw)
    directive = cache_directive(call)
    plan = plan_route(call, raw, principal, door)
    cached = cache_plan(call, door, raw, principal, plan, directive)
    if cached is None:
        await reserve(call, raw, principal, plan)
    else:  # the lookup beside the reservation: one round trip's wait for both
        hit = await reserve_and_look_up(call, cached, reserve(call, raw, principal, plan))
        if hit is not None:
            return served_from_cache(call, door, raw, plan, hit)
    if door.streamable and raw.get("stream") is True:
        return await _stream(call, exchange, plan, cached)  # dispatch, then relay by event
    result = await call.services.dispatcher.run(plan, _json_attempt(call, exchange))
    response = answered(call, plan, result, door)
    if cached is not None:
        answer = result.value.answer
        assert answer is not None
        keep_answer(call, cached, result.candidate, answer, call.outcome.usage)
    return response


async def authenticate(call: V1Call) -> Principal:
    credential = client_credential(call.request.headers)
    with call.trace.stage("authenticate"):
        principal = await call.services.auth.authenticate(credential)
    call.outcome.key_id = principal.key_id
    return principal


def attribute(call: V1Call, raw: dict[str, Any], principal: Principal) -> None:
    """The end user and tags the request is charged to (a 400 when malformed); the gateway's
    own ``metadata.tags`` leaves the body before it is checked and sent upstream."""
    call.attribution = take_attribution(raw, call.request.headers, principal.record.tags)


def plan_route(call: V1Call, raw: dict[str, Any], principal: Principal, door: Door) -> RoutePlan:
    """The ordered candidates, each one a model that serves the door's operation; the
    request's books open here (from now on it leaves a usage event, failed or not)."""
    policies = call.services.policies
    if not policies.loaded:
        raise ServiceUnavailable("no routing policy is loaded", code="policy_not_loaded")
    plan = call.services.router.plan(
        body=raw,
        headers=call.request.headers,
        key_id=principal.key_id,
        allowed_models=allowed_models(principal, policies.current.policy),
        operation=door.operation,
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
        attribution=call.attribution,
    )
    outcome.record_id = call.books.record_id
    call.headers[USAGE_ID_HEADER] = call.books.record_id
    return plan


async def reserve(call: V1Call, raw: dict[str, Any], principal: Principal, plan: RoutePlan) -> None:
    """The key's limits for the request's worst case: the one Redis round trip before the
    upstream call."""
    books = call.books
    assert books is not None and books.policy is not None
    with call.trace.stage("limits"):
        books.reservation, books.estimate = await call.services.gate.reserve(
            principal, plan, raw, books.policy, books.record_id, call.route
        )
    if books.reservation is not None:
        call.headers.update(books.reservation.headers)


class Upstream:
    """A candidate's provider and what every call to it carries (the forwarded headers)."""

    def __init__(self, call: V1Call, candidate: Candidate) -> None:
        books = call.books
        assert books is not None and books.policy is not None
        self.config: ProviderConfig = books.policy.providers[candidate.provider]
        self.provider: Provider = call.services.providers.get(candidate.provider, self.config)
        self.headers = forwarded_headers(
            call.request.headers, self.config.forward_headers, call.outcome.request_id
        )

    def traced(self, call: V1Call, candidate: Candidate) -> AttemptTrace:
        """This try's span (retries and fallbacks each get one); its ``traceparent`` goes
        upstream in place of the client's."""
        call.tries += 1
        tried = call.trace.attempt(
            number=call.tries,
            provider=candidate.provider,
            model=candidate.model,
            upstream_model=candidate.upstream_model,
            local=self.config.kind == "local",
        )
        tried.inject(self.headers)
        return tried


def end_stream_try(tried: AttemptTrace, status: int) -> None:
    """The served try of a stream ends with the stream (cut, or the client gone)."""
    if status == 200:
        tried.end("ok", status=200)
    else:
        tried.end("cancelled" if status == CLIENT_GONE else "failed", status=status)


def end_try(tried: AttemptTrace, error: BaseException) -> None:
    """A try that raised: its status and kind (never the message: it may quote upstream)."""
    if isinstance(error, UpstreamError):
        tried.end("failed", status=error.status, error_type=error.kind)
    else:
        tried.end("failed", error_type=type(error).__name__)


def note_served(call: V1Call, plan: RoutePlan, result: DispatchResult[Any]) -> Candidate:
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


def answered(call: V1Call, plan: RoutePlan, result: DispatchResult[Served], door: Door) -> Response:
    """The JSON (or raw) answer of the candidate that served."""
    note_served(call, plan, result)
    answer = result.value.answer
    assert answer is not None
    call.outcome.usage = answer.usage if door.metered else NOTHING
    if call.services.tracing.enabled and door.format == "openai_chat":
        call.trace.observe_response(_json_or_none(answer.body))
    return Response(
        answer.body, status_code=200, headers=call.headers, media_type=result.value.reply_type
    )


def refused(call: V1Call, door: Door, exc: GatewayError) -> Response:
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
    return error_response(door.format, exc, call.headers)


def _prepare_try(
    call: V1Call, exchange: Exchange, candidate: Candidate, *, stream: bool
) -> tuple[Upstream, FormatName, str, dict[str, Any], AttemptTrace]:
    """One upstream try's provider, wire format, path and body, and its trace span."""
    upstream = Upstream(call, candidate)
    provider = upstream.provider
    target = exchange.target(candidate.provider, provider.formats, provider.door_paths)
    assert call.books is not None and call.books.policy is not None
    model = call.books.policy.models.get(candidate.model)
    path, body = exchange.upstream_body(
        target,
        candidate.upstream_model,
        stream=stream,
        provider=candidate.provider,
        config=upstream.config,
        defaults=model.defaults if model is not None else None,
    )
    return upstream, target, path, body, upstream.traced(call, candidate)


def _json_attempt(call: V1Call, exchange: Exchange) -> Callable[[Candidate], Awaitable[Served]]:
    receive = call.request.receive

    async def attempt(candidate: Candidate) -> Served:
        upstream, target, path, body, tried = _prepare_try(call, exchange, candidate, stream=False)
        provider = upstream.provider
        try:
            # A provider that works long before answering (the local engine) stops when the
            # client hangs up.
            reply = await provider.post_json(
                path, body, headers=upstream.headers, client_gone=receive
            )
            if reply.phases is not None:
                tried.engine_phases(reply.phases)
            answer = exchange.answer(target, reply, candidate.provider)
            served = Served(answer=answer, target=target, route_note=reply.route_note)
        except BaseException as exc:
            end_try(tried, exc)
            raise
        tried.end("ok", status=reply.status)
        return served

    return attempt


async def _stream(
    call: V1Call, exchange: Exchange, plan: RoutePlan, cached: CachedRequest | None
) -> Response:
    services, outcome, books = call.services, call.outcome, call.books
    assert books is not None
    outcome.stream = books.streamed = True

    async def attempt(candidate: Candidate) -> Served:
        upstream, target, path, body, tried = _prepare_try(call, exchange, candidate, stream=True)
        provider = upstream.provider
        try:
            stream = await provider.open_stream(path, body, headers=upstream.headers)
        except BaseException as exc:
            end_try(tried, exc)
            raise
        call.held_try = tried
        return Served(stream=stream, target=target, route_note=stream.route_note)

    result = await services.dispatcher.run(plan, attempt, hold=True)
    served = note_served(call, plan, result)
    call.headers.update(SSE_HEADERS)
    upstream = result.value.stream
    assert upstream is not None and books.policy is not None
    provider = services.providers.get(served.provider, books.policy.providers[served.provider])
    relay = exchange.relay(result.value.target)
    client = exchange.door.format
    keeper = StreamKeeper(call, cached) if cached is not None else None
    # Tracing on: the span reads the chunks' ids, finish reasons (and text, when captured).
    observe = services.tracing.enabled and result.value.target == "openai_chat"

    async def body() -> AsyncGenerator[bytes, None]:
        error: str | None = None
        last: bytes | None = None  # the stream's end or error: sent once the books are closed
        outcome.status = 499  # until the stream completes: the client went away
        try:
            yield b""  # where a body that is never relayed stops (ClosingStreamingResponse)
            try:
                async for data in upstream.events():
                    if books.ttft_ms is None:
                        ttft_s = time.perf_counter() - outcome.started
                        books.ttft_ms = int(ttft_s * 1000)
                        services.metrics.ttft.labels(served.model).observe(ttft_s)
                    if observe and data != b"[DONE]":
                        call.trace.observe_chunk(_json_or_none(data))
                    out = relay.feed(data)
                    if keeper is not None:
                        keeper.add(relay, out)
                    if relay.finished:
                        last = out
                        break
                    if out:
                        yield out
                else:
                    last = relay.close()
                    if relay.error is not None:
                        raise UpstreamError(
                            f"upstream provider {served.provider} ended the stream early",
                            kind="protocol",
                            provider=served.provider,
                        )
            except FormatError as exc:  # a translated stream that breaks its own format
                raise broken_answer(exc, served.provider) from None
            if relay.error is not None:
                raise provider.stream_error(relay.error)
            outcome.status = 200
            result.succeeded()  # a clean end: only now a success for breaker and latency
            if keeper is not None:
                keeper.keep(served, Usage.of(relay.usage))
        except UpstreamError as exc:
            outcome.status = exc.status
            error = exc.message
            services.metrics.upstream_errors.labels(served.provider, exc.kind).inc()
            # Too late to fall back, but the breaker must see it: a provider that always cuts
            # its streams would otherwise stay in rotation.
            result.failed()
            last = stream_error(client, relay, exc)
        finally:
            # However it ends (done, cut, or the client gone): upstream closed, the provider
            # slot given back (no verdict when the client went away), then the request's end.
            _meter(call, relay, exchange.door.metered)
            if services.tracing.enabled and isinstance(upstream, PhasedStream):
                call.held_try.engine_phases(upstream.phases())
            end_stream_try(call.held_try, outcome.status)
            if keeper is not None and outcome.status != 200:
                keeper.incomplete()
            upstream.close()
            result.release()
            recorded = call.end(error)
        await durable(recorded)  # the client sees the end of the stream once it is recorded
        if last:
            yield last

    response = await ClosingStreamingResponse.started(
        body(), status_code=200, headers=call.headers, media_type="text/event-stream"
    )
    call.streaming = True
    return response


def _json_or_none(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _meter(call: V1Call, relay: StreamRelay, metered: bool) -> None:
    """What the stream showed of its usage, for the books (whatever point it ended at)."""
    books = call.books
    assert books is not None
    books.streamed_chunks = relay.produced
    usage = Usage.of(relay.usage)
    if usage is not None:
        call.outcome.usage = usage if metered else NOTHING
