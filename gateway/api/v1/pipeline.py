"""The one /v1 pipeline, whatever the front door: a stage a line in ``V1Pipeline.answer``.

read the body → authenticate (a bearer or ``x-api-key``) → check it at the door → plan the
route → reserve limits (the one Redis round trip; the response cache's lookup beside it) →
dispatch (the dispatcher tries the candidates, each with a provider-side attempt:
``providers/attempt.py``) → the answer (JSON, or a stream relayed event by event:
``stream.py``). Each stage gets what it needs and returns what it made; the request's books
are opened with it and closed at its one end, JSON or stream, answered or refused
(``request_end.py``). The door (``doors.py``) decides what differs by format: the checks, the
error envelope, the rendering of answers and streams. Speech and uploads (``uploads.py``)
share every stage but the reading and the sending of their body.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.auth import Principal, client_credential
from gateway.api.endpoint import Guard, endpoint
from gateway.api.envelopes import error_body
from gateway.api.http import read_body
from gateway.api.strict_json import parse_json_object
from gateway.api.v1.doors import Door
from gateway.api.v1.request_end import Call, Calls, Failed, Reply, answer_headers
from gateway.api.v1.stream import NOTHING, SSE_HEADERS, StreamReply
from gateway.cache import BYPASS, HIT, MISS, CacheEntry, CacheUnavailable, Lookup
from gateway.cache.request import (
    CACHEABLE_ROUTES,
    CachedRequest,
    StreamKeeper,
    cache_directive,
    cached_request,
    keep_json,
)
from gateway.errors import GatewayError, RateLimited, ServiceUnavailable, UpstreamError
from gateway.formats.internal import Usage
from gateway.formats.translation import Translation
from gateway.metering.accounting import Accounting
from gateway.metering.attribution import take_attribution
from gateway.metrics import Metrics
from gateway.policy import Candidate, Policy
from gateway.providers.attempt import Answer, JsonAttempt, StreamAttempt, Upstreams
from gateway.providers.forwarding import listed_headers
from gateway.redact import redact
from gateway.routing.dispatch import AttemptRecord, DispatchResult
from gateway.routing.router import RoutePlan
from gateway.server.exchange import CLIENT_GONE, request_id_of
from gateway.server.header_map import header_map
from gateway.services import Services
from gateway.tracing import RequestTrace

# What a door's request is answered by: the JSON doors' stages, speech's, an upload's.
Answering = Callable[["V1Pipeline", Call, Door], Awaitable[Reply]]


class V1Pipeline:
    """The /v1 pipeline's parts, built once by the app from the services, and its stages."""

    def __init__(self, services: Services) -> None:
        settings = services.settings
        self.max_body_bytes = settings.max_body_bytes
        self.max_upload_bytes = settings.max_upload_bytes
        self.auth = services.auth
        self.policies = services.policies
        self.router = services.router
        self.gate = services.gate
        self.cache = services.cache
        self.dispatcher = services.dispatcher
        self.providers = services.providers
        self.metrics = services.metrics
        self.log = services.log
        self.tracing = services.tracing
        self.calls = Calls(
            services.accountant,
            services.metrics,
            services.log,
            services.tracing,
            access_log=settings.access_log,
        )

    async def serve(self, request: Request, door: Door, answering: Answering) -> Response:
        """One request at ``door`` from its first byte to its end: answered, or refused in
        the door's envelope, then ended once."""
        call = self.calls.open(request, door.route)
        try:
            reply = await answering(self, call, door)
        except GatewayError as exc:
            reply = self.refused(call.books, door, exc)
        except ClientDisconnect as exc:
            reply = Failed(CLIENT_GONE, exc)
        except Exception as exc:  # a bug: the exchange middleware answers with the catch-all 500
            reply = Failed(500, exc)
        except asyncio.CancelledError as exc:  # the server stopping, a batch line called back
            await self.calls.deliver(call, Failed(CLIENT_GONE, exc))  # ended first,
            raise  # then the cancellation goes on to whoever asked for it
        return await self.calls.deliver(call, reply)

    async def answer(self, call: Call, door: Door) -> Reply:
        """A JSON door's request (a chat door's answer may stream)."""
        request, books = call.request, call.books
        body = await read_body(request, self.max_body_bytes)
        principal = await self.authenticate(call)
        raw = parse_json_object(body)  # after auth: strangers learn nothing of the schema
        headers = header_map(request.scope)
        books.attribution = take_attribution(raw, headers, principal.record.tags)
        translation = Translation(door.client_side, raw, door.check(raw))
        call.trace.request(door.route, raw)
        directive = cache_directive(headers)
        plan, policy = self.plan(books, raw, principal, door, headers)
        cached = self.cache_plan(door, raw, principal, plan, directive, headers)
        hit = await self.reserve(call, raw, principal, plan, policy, cached)
        if hit is not None:
            return cache_hit(books, door, raw, plan, hit, call.trace)
        if door.streamable and raw.get("stream") is True:
            return await self.stream(call, door, translation, plan, policy, cached)
        attempt = JsonAttempt(self.upstreams(call, policy), translation, request.receive)
        result = await self.dispatcher.run(plan, attempt)
        reply = self.answered(call, door, plan, result)
        if cached is not None:
            keep_json(self.cache, cached, result.candidate, result.value.body, reply.usage)
        return reply

    async def authenticate(self, call: Call) -> Principal:
        credential = client_credential(header_map(call.request.scope))
        with call.trace.stage("authenticate"):
            principal = await self.auth.authenticate(credential)
        call.books.key_id, call.books.team = principal.key_id, principal.record.team or ""
        return principal

    def plan(
        self,
        books: Accounting,
        raw: dict[str, Any],
        principal: Principal,
        door: Door,
        headers: Mapping[str, str],
    ) -> tuple[RoutePlan, Policy]:
        """The ordered candidates, each one a model that serves the door's operation, and the
        policy they come from; from now on the request leaves a usage event, failed or not."""
        policies = self.policies
        if not policies.loaded:
            raise ServiceUnavailable("no routing policy is loaded", code="policy_not_loaded")
        plan = self.router.plan(
            body=raw,
            headers=headers,
            key_id=principal.key_id,
            allowed_models=allowed_models(principal, policies.current.policy),
            operation=door.operation,
        )
        books.plan, books.policy = plan, plan.policy or policies.current.policy
        return plan, books.policy

    def cache_plan(
        self,
        door: Door,
        raw: dict[str, Any],
        principal: Principal,
        plan: RoutePlan,
        directive: Any,
        headers: Mapping[str, str],
    ) -> CachedRequest | None:
        """The response cache's part in this request (None: ``bypass``)."""
        config = plan.cache_policy() if door.route in CACHEABLE_ROUTES else None
        if config is None:
            return None
        return cached_request(
            self.cache,
            route=door.route,
            body=raw,
            stream=door.streamable and raw.get("stream") is True,
            first=plan.candidates[0],
            config=config,
            directive=directive,
            team=principal.record.team,
            key_id=principal.key_id,
            forwarded=listed_headers(headers, plan.forwarded_header_names()),
        )

    async def reserve(
        self,
        call: Call,
        raw: dict[str, Any],
        principal: Principal,
        plan: RoutePlan,
        policy: Policy,
        cached: CachedRequest | None,
    ) -> CacheEntry | None:
        """The key's limits for the request's worst case: the one Redis round trip before the
        upstream call; the cache's lookup beside it, one round trip's wait for both. A hit is
        the answer (it counts against the key's limits like any request); a refused
        reservation raises as it would alone (its answer says ``bypass``); an unreachable
        cache is a request served uncached."""
        books = call.books

        async def reserving() -> None:
            with call.trace.stage("limits"):
                books.reservation, books.estimate = await self.gate.reserve(
                    principal, plan, raw, policy, books.record_id, books.route
                )

        if cached is None:
            await reserving()
            return None
        _, found = await asyncio.gather(reserving(), self._look_up(call.trace, cached))
        if found is None:
            return None
        cached.epoch = found.epoch
        books.cache = HIT if found.entry is not None else MISS
        return found.entry

    async def _look_up(self, trace: RequestTrace, cached: CachedRequest) -> Lookup | None:
        with trace.stage("cache") as stage:
            try:
                found = await self.cache.lookup(
                    cached.scope, cached.key, cached.policy, max_age_s=cached.directive.max_age_s
                )
            except CacheUnavailable as exc:
                self.log.warning("cache_unavailable", error=str(exc))
                stage.set("switchyard.cache", BYPASS)
                return None
            stage.set("switchyard.cache", HIT if found.entry is not None else MISS)
            return found

    def upstreams(self, call: Call, policy: Policy) -> Upstreams:
        """Where this request's tries go: the providers of ``policy``, with the client's
        headers that may go on, each try a span of its own."""
        request = call.request
        return Upstreams(
            self.providers, policy, header_map(request.scope), request_id_of(request), call.trace
        )

    async def stream(
        self,
        call: Call,
        door: Door,
        translation: Translation,
        plan: RoutePlan,
        policy: Policy,
        cached: CachedRequest | None,
    ) -> Reply:
        """Dispatch, then relay the served candidate's stream event by event."""
        books = call.books
        books.streamed = True
        attempt = StreamAttempt(self.upstreams(call, policy), translation)
        result = await self.dispatcher.run(plan, attempt, hold=True)
        route = self.served(books, plan, result)
        return StreamReply(
            {**answer_headers(books), **route},
            result=result,
            relay=translation.relay(result.value.target),
            client=door.format,
            metered=door.metered,
            books=books,
            keeper=StreamKeeper(self.cache, cached) if cached is not None else None,
            metrics=self.metrics,
            trace=call.trace,
            tracing=self.tracing.enabled,
        )

    def served(
        self, books: Accounting, plan: RoutePlan, result: DispatchResult[Any]
    ) -> dict[str, str]:
        """Note who served, after how many tries, and the time the gateway itself took;
        returns the route headers that say so."""
        served: Candidate = result.candidate
        books.served_model, books.served_provider = served.model, served.provider
        books.route_reason, books.attempts = served.reason, len(result.attempts)
        count_attempts(self.metrics, plan, result.attempts, served)
        upstream_s = sum(attempt.duration_s for attempt in result.attempts)
        elapsed = time.perf_counter() - books.started
        self.metrics.overhead.labels(books.route).observe(max(elapsed - upstream_s, 0.0))
        return route_headers(plan, served, result.attempts, result.value.route_note)

    def answered(
        self, call: Call, door: Door, plan: RoutePlan, result: DispatchResult[Answer]
    ) -> Reply:
        """The whole (JSON or raw) answer of the candidate that served."""
        route = self.served(call.books, plan, result)
        answer = result.value
        if self.tracing.enabled and door.format == "openai_chat":
            call.trace.observe_response(_json_or_none(answer.body))
        return Reply(
            200,
            {**answer_headers(call.books), **route},
            answer.body,
            answer.media_type,
            usage=answer.usage if door.metered else NOTHING,
        )

    def refused(self, books: Accounting, door: Door, exc: GatewayError) -> Reply:
        """The client's error envelope, and what the failure tells the metrics and the books."""
        metrics, provider = self.metrics, None
        if isinstance(exc, UpstreamError) and exc.provider and books.served_provider is None:
            provider = exc.provider
            metrics.upstream_errors.labels(exc.provider, exc.kind).inc()
        failed_attempts = getattr(exc, "attempts", None)
        if failed_attempts:
            count_attempts(metrics, None, failed_attempts, None)
        if isinstance(exc, RateLimited):
            metrics.rate_limited.labels(exc.code or "rate_limit_exceeded").inc()
        books.attempts = len(failed_attempts or ())
        headers = {**answer_headers(books), **exc.headers}
        return Reply(exc.status, headers, error_body(door.format, exc), provider=provider)


def allowed_models(principal: Principal, policy: Policy) -> frozenset[str] | None:
    """The key's allow-list in canonical model names (aliases resolved); None = all."""
    models = principal.record.models
    if models is None:
        return None
    return frozenset(policy.resolve_model(name) or name for name in models)


def count_attempts(
    metrics: Metrics,
    plan: RoutePlan | None,
    attempts: list[AttemptRecord],
    served: Candidate | None,
) -> None:
    """Count every try (ok, failed, skipped), and a fallback when another than the first
    candidate served."""
    counter = metrics.upstream_attempts
    for record in attempts:
        counter.labels(record.provider, record.model, record.outcome).inc()
    if served is not None and plan is not None and plan.candidates:
        first = plan.candidates[0].model
        if first != served.model:
            metrics.fallbacks.labels(first, served.model).inc()


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


def cache_hit(
    books: Accounting,
    door: Door,
    raw: dict[str, Any],
    plan: RoutePlan,
    entry: CacheEntry,
    trace: RequestTrace,
) -> Reply:
    """A hit: the stored answer, byte for byte what the first client got, booked as usage
    from the cache (no cost, no upstream tokens against TPM)."""
    books.served_model, books.served_provider = entry.model, entry.provider
    books.route_reason = "cache"
    stored = entry.usage
    usage = None
    if stored is not None:
        usage = Usage(stored.prompt_tokens, stored.completion_tokens, stored.prompt_tokens)
    headers = answer_headers(books)
    headers["x-switchyard-model"] = entry.model
    headers["x-switchyard-provider"] = entry.provider
    headers["x-switchyard-route"] = (
        f"task={plan.task or '-'}; strategy={plan.strategy}; reason=cache"
    )
    headers["age"] = str(entry.age_s(time.time_ns() // 1_000_000))
    trace.set("switchyard.cache", HIT)
    if entry.mode == "json":
        return Reply(200, headers, entry.body, usage=usage)
    books.streamed = True
    options = raw.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    headers.update(SSE_HEADERS)
    # Whole, at once: the usage record is durable before the answer goes out.
    body = entry.sse_body(include_usage or door.format != "openai_chat")
    return Reply(200, headers, body, "text/event-stream", usage=usage)


def _json_or_none(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def door_route(door: Door, answering: Answering = V1Pipeline.answer, note: str = "") -> Route:
    """``POST /v1<door.path>``: ``door``'s requests on the app's pipeline, named after the
    door's route label. ``Guard.NONE``: the pipeline authenticates as one of its stages, so
    that its errors are in the client's format."""

    async def handler(request: Request, services: Services) -> Response:
        pipeline: V1Pipeline = request.scope["state"]["v1"]  # built by the lifespan
        return await pipeline.serve(request, door, answering)

    handler.__name__ = door.route.replace(".", "_")
    handler.__doc__ = f"``POST /v1{door.path}``{note}"
    return Route(f"/v1{door.path}", endpoint(handler, Guard.NONE), methods=["POST"])
