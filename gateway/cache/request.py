"""The cache's part in one request: whether it takes part, and keeping its answer.

``cached_request`` decides from the effective ``cache:`` block (the task's, else the first
candidate's model's: the caller reads the policy), the request's determinism and the client's
directive whether the cache takes part, and keys the entry on the body, the routed model and
the client's headers that a candidate's provider forwards. The lookup then runs beside the
limits' reservation (``ResponseCache.lookup``: its ``epoch`` is noted here, for the store). A
miss's answer is stored after it went out: a JSON one whole (``keep_json``), a stream as it was
relayed (``StreamKeeper``), and only when it ended cleanly.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.cache.controls import CacheDirective, CacheHeaderError, directive_of
from gateway.cache.entry import CachedUsage, CacheEntry
from gateway.cache.key import CacheScope, Mode, nondeterminism, request_key
from gateway.cache.recorder import StreamRecorder
from gateway.cache.store import ResponseCache
from gateway.errors import InvalidRequest
from gateway.formats.internal import Usage
from gateway.formats.openai_chat.relay import ChatRelay
from gateway.formats.relay import StreamRelay
from gateway.policy import CachePolicy, Candidate

# Doors whose answers are text the model computed from the body alone (not uploads, audio or
# images, whose answers are large or sampled; not token counting, which costs nothing).
CACHEABLE_ROUTES = frozenset(
    {"chat.completions", "completions", "embeddings", "messages", "responses"}
)


@dataclass(slots=True)
class CachedRequest:
    """A request the cache takes part in: where its entry lives, under which policy."""

    scope: CacheScope
    key: str
    policy: CachePolicy
    directive: CacheDirective
    mode: Mode
    epoch: int | None = None  # set by the lookup; None: not looked up, so not stored


def cache_directive(headers: Mapping[str, str]) -> CacheDirective:
    """The client's cache headers (checked before routing: a bad one is a 400 and no usage)."""
    try:
        return directive_of(headers)
    except CacheHeaderError as exc:
        raise InvalidRequest(exc.message, param=exc.header, code="invalid_cache_header") from None


def cached_request(
    cache: ResponseCache,
    *,
    route: str,
    body: Mapping[str, Any],
    stream: bool,
    first: Candidate,
    config: CachePolicy | None,
    directive: CacheDirective,
    team: str | None,
    key_id: str,
    forwarded: Mapping[str, str],
) -> CachedRequest | None:
    """The cache's part in this request, or None (answered with ``bypass``). ``first``: the
    first candidate (the entry is its model's); ``forwarded``: the client's headers that any
    candidate's provider passes on (they may change the answer, so they are part of the key,
    whichever candidate serves)."""
    if route not in CACHEABLE_ROUTES or config is None:
        return None
    scope = CacheScope.of(model=first.model, team=team, key_id=key_id, shared=config.shared)
    if not config.allow_nondeterministic and nondeterminism(route, body) is not None:
        cache.note(scope, "skip_nondeterministic", config)
        return None
    if not directive.lookup:  # without the lookup's epoch nothing may be stored either
        cache.note(scope, "bypass", config)
        return None
    mode: Mode = "sse" if stream else "json"
    key = request_key(route, body, mode, first, forwarded)
    return CachedRequest(scope, key, config, directive, mode)


def cached_usage(usage: Usage | None) -> CachedUsage | None:
    if usage is None:
        return None
    return CachedUsage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def _may_store(cache: ResponseCache, cached: CachedRequest) -> bool:
    if cached.epoch is None:
        return False
    if not cached.directive.store:
        cache.note(cached.scope, "skip_no_store", cached.policy)
        return False
    return True


def keep_json(
    cache: ResponseCache, cached: CachedRequest, served: Candidate, body: bytes, usage: Usage | None
) -> None:
    """Store a JSON answer beside the request (it goes out meanwhile)."""
    if not _may_store(cache, cached):
        return
    entry = CacheEntry(
        mode="json",
        model=served.model,
        provider=served.provider,
        created_ms=time.time_ns() // 1_000_000,
        body=body,
        usage=cached_usage(usage),
    )
    cache.store_later(cached.scope, cached.key, entry, cached.policy, epoch=cached.epoch or 0)


class StreamKeeper:
    """Records a stream's frames as they are relayed; ``keep`` stores a clean stream."""

    __slots__ = ("_cache", "_cached", "_recorder")

    def __init__(self, cache: ResponseCache, cached: CachedRequest) -> None:
        self._cache = cache
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
        self._cache.note(cached.scope, "skip_incomplete", cached.policy)

    def keep(self, served: Candidate, usage: Usage | None) -> None:
        cache, cached = self._cache, self._cached
        if not _may_store(cache, cached):
            return
        entry = self._recorder.finish(
            model=served.model, provider=served.provider, usage=cached_usage(usage)
        )
        if entry is None:
            cache.note(cached.scope, "skip_too_large", cached.policy)
            return
        cache.store_later(cached.scope, cached.key, entry, cached.policy, epoch=cached.epoch or 0)
