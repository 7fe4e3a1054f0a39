"""The response cache's stage of the /v1 pipeline: is this request cached, was it answered
before, and keep its answer.

After routing, ``cache_plan`` decides from the policy's ``cache:`` block (the task's, else the
first candidate's model's), the request's determinism and the client's headers whether the
cache takes part, and keys the entry on the body and on the client's headers that a
candidate's provider forwards; ``reserve_and_look_up`` then runs the limits' reservation and the lookup
side by side, so a cached request still waits for one Redis round trip before its answer (a
hit counts against the key's limits like any request). A hit is answered here, byte for byte
what the first client got, and booked as usage from the cache (0 cost, no upstream tokens
against TPM); a miss is dispatched as usual and its answer (JSON, or the stream recorded as it
was relayed) is stored after it went out. ``x-switchyard-cache`` says which on every answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from gateway.access.auth import Principal
from gateway.api.doors import Door
from gateway.api.http import JSON
from gateway.api.request_end import V1Call
from gateway.api.translation import Answer
from gateway.cache import (
    BYPASS,
    CACHE_HEADER,
    HIT,
    MISS,
    CacheDirective,
    CachedUsage,
    CacheEntry,
    CacheHeaderError,
    CacheScope,
    CacheUnavailable,
    Lookup,
    Mode,
    StreamRecorder,
    directive_of,
    nondeterminism,
    request_key,
)
from gateway.errors import InvalidRequest
from gateway.formats.openai_chat.relay import ChatRelay
from gateway.formats.relay import StreamRelay
from gateway.metering.gate import Usage
from gateway.policy import CachePolicy, effective_cache
from gateway.providers.forwarding import listed_headers
from gateway.routing.router import Candidate, RoutePlan

# Doors whose answers are text the model computed from the body alone (not uploads, audio or
# images, whose answers are large or sampled; not token counting, which costs nothing).
CACHEABLE_ROUTES = frozenset(
    {"chat.completions", "completions", "embeddings", "messages", "responses"}
)
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass(slots=True)
class CachedRequest:
    """A request the cache takes part in: where its entry lives, under which policy."""

    scope: CacheScope
    key: str
    policy: CachePolicy
    directive: CacheDirective
    mode: Mode
    epoch: int | None = None  # set by the lookup; None: not looked up, so not stored


def cache_directive(call: V1Call) -> CacheDirective:
    """The client's cache headers (checked before routing: a bad one is a 400 and no usage)."""
    try:
        return directive_of(call.request.headers)
    except CacheHeaderError as exc:
        raise InvalidRequest(exc.message, param=exc.header, code="invalid_cache_header") from None


def cache_plan(
    call: V1Call,
    door: Door,
    raw: dict[str, Any],
    principal: Principal,
    plan: RoutePlan,
    directive: CacheDirective,
) -> CachedRequest | None:
    """The cache's part in this request, or None (answered with ``bypass``)."""
    policy = plan.policy
    if door.route not in CACHEABLE_ROUTES or policy is None or not plan.candidates:
        return None
    first = plan.candidates[0]
    task = policy.tasks.get(plan.task) if plan.task else None
    model = policy.models.get(first.model)
    config = effective_cache(
        task.cache if task is not None else None, model.cache if model is not None else None
    )
    if config is None:
        return None
    record = principal.record
    scope = CacheScope.of(
        model=first.model, team=record.team, key_id=principal.key_id, shared=config.shared
    )
    cache = call.services.cache
    if not config.allow_nondeterministic and nondeterminism(door.route, raw) is not None:
        cache.note(scope, "skip_nondeterministic", config)
        return None
    if not directive.lookup:  # without the lookup's epoch nothing may be stored either
        cache.note(scope, "bypass", config)
        return None
    mode: Mode = "sse" if door.streamable and raw.get("stream") is True else "json"
    key = request_key(door.route, raw, mode, first, _forwarded(call, plan))
    return CachedRequest(scope, key, config, directive, mode)


def _forwarded(call: V1Call, plan: RoutePlan) -> dict[str, str]:
    """The client's headers that any candidate's provider passes on (``forward_headers``):
    they may change the answer, so they are part of the key, whichever candidate serves."""
    policy = plan.policy
    assert policy is not None
    allow: set[str] = set()
    for candidate in plan.candidates:
        provider = policy.providers.get(candidate.provider)
        if provider is not None:
            allow.update(name.lower() for name in provider.forward_headers)
    return listed_headers(call.request.headers, sorted(allow))


async def reserve_and_look_up(
    call: V1Call, cached: CachedRequest, reserve: Awaitable[None]
) -> CacheEntry | None:
    """The reservation (``reserve``, awaited) and the lookup at once: one round trip's wait.
    A refused reservation raises as it would alone (its answer says ``bypass``); an
    unreachable cache is a request served uncached."""
    _, found = await asyncio.gather(reserve, _look_up(call, cached))
    if found is None:
        return None
    cached.epoch = found.epoch
    call.headers[CACHE_HEADER] = HIT if found.entry is not None else MISS
    return found.entry


async def _look_up(call: V1Call, cached: CachedRequest) -> Lookup | None:
    with call.trace.stage("cache") as stage:
        try:
            found = await call.services.cache.lookup(
                cached.scope, cached.key, cached.policy, max_age_s=cached.directive.max_age_s
            )
        except CacheUnavailable as exc:
            call.services.log.warning("cache_unavailable", error=str(exc))
            stage.set("switchyard.cache", BYPASS)
            return None
        stage.set("switchyard.cache", HIT if found.entry is not None else MISS)
        return found


def cache_hit_response(
    call: V1Call, door: Door, raw: dict[str, Any], plan: RoutePlan, entry: CacheEntry
) -> Response:
    """A hit: the stored answer, booked as usage from the cache."""
    books, outcome = call.books, call.outcome
    assert books is not None
    books.served_model, books.served_provider = entry.model, entry.provider
    books.cache_hit = True
    outcome.model, outcome.provider, outcome.route_reason = entry.model, entry.provider, "cache"
    usage = entry.usage
    if usage is not None:
        outcome.usage = Usage(usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens)
    headers = call.headers
    headers["x-switchyard-model"] = entry.model
    headers["x-switchyard-provider"] = entry.provider
    headers["x-switchyard-route"] = (
        f"task={plan.task or '-'}; strategy={plan.strategy}; reason=cache"
    )
    headers["age"] = str(entry.age_s(time.time_ns() // 1_000_000))
    call.trace.set("switchyard.cache", HIT)
    if entry.mode == "json":
        return Response(entry.body, status_code=200, headers=headers, media_type=JSON)
    outcome.stream = books.streamed = True
    options = raw.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    headers.update(SSE_HEADERS)
    # Whole, at once: the usage record is durable before the handler returns it.
    return Response(
        entry.sse_body(include_usage or door.format != "openai_chat"),
        status_code=200,
        headers=headers,
        media_type="text/event-stream",
    )


def _usage(usage: Usage | None) -> CachedUsage | None:
    if usage is None:
        return None
    return CachedUsage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def _may_store(call: V1Call, cached: CachedRequest) -> bool:
    if cached.epoch is None:
        return False
    if not cached.directive.store:
        call.services.cache.note(cached.scope, "skip_no_store", cached.policy)
        return False
    return True


def keep_answer(
    call: V1Call, cached: CachedRequest, served: Candidate, answer: Answer, usage: Usage | None
) -> None:
    """Store a JSON answer beside the request (it goes out meanwhile)."""
    if not _may_store(call, cached):
        return
    entry = CacheEntry(
        mode="json",
        model=served.model,
        provider=served.provider,
        created_ms=time.time_ns() // 1_000_000,
        body=answer.body,
        usage=_usage(usage),
    )
    call.services.cache.store_later(
        cached.scope, cached.key, entry, cached.policy, epoch=cached.epoch or 0
    )


class StreamKeeper:
    """Records a stream's frames as they are relayed; ``keep`` stores a clean stream."""

    __slots__ = ("_cached", "_call", "_recorder")

    def __init__(self, call: V1Call, cached: CachedRequest) -> None:
        self._call = call
        self._cached = cached
        self._recorder = StreamRecorder(cached.policy.max_entry_bytes)

    def add(self, relay: StreamRelay, out: bytes) -> None:
        """What the relay just sent (and the usage chunk it held back from the client)."""
        if isinstance(relay, ChatRelay) and relay.withheld is not None:
            self._recorder.add(relay.withheld, optional=True)
            relay.withheld = None
        if out:
            self._recorder.add(out)

    def incomplete(self) -> None:
        """The stream broke or its client left: nothing is stored."""
        cached = self._cached
        self._call.services.cache.note(cached.scope, "skip_incomplete", cached.policy)

    def keep(self, served: Candidate, usage: Usage | None) -> None:
        call, cached = self._call, self._cached
        if not _may_store(call, cached):
            return
        entry = self._recorder.finish(
            model=served.model, provider=served.provider, usage=_usage(usage)
        )
        if entry is None:
            call.services.cache.note(cached.scope, "skip_too_large", cached.policy)
            return
        call.services.cache.store_later(
            cached.scope, cached.key, entry, cached.policy, epoch=cached.epoch or 0
        )
