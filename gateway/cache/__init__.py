"""The exact-match response cache: identical deterministic requests answered from Redis.

A request's answer is cached when its model or task has a ``cache:`` block in the policy
(``gateway.policy.CachePolicy``), the request is deterministic (``nondeterminism`` is None, or the policy
allows more) and the client does not opt out (``directive_of`` its headers). The entry's key
is a hash of the canonical request after routing (``request_key``), kept in a scope per team
(``CacheScope``) unless the policy shares it. ``ResponseCache`` looks up in one round trip and
stores after the answer went out; ``StreamRecorder`` keeps a stream's frames as they are
relayed and ``CacheEntry.sse_body`` replays them byte for byte. Nothing here knows HTTP
handlers, limits or usage: the request pipeline decides what a hit costs.
"""

from gateway.cache.controls import (
    BYPASS,
    CACHE_HEADER,
    DEFAULT_DIRECTIVE,
    HIT,
    MISS,
    CacheDirective,
    CacheHeaderError,
    directive_of,
)
from gateway.cache.entry import CachedUsage, CacheEntry, CacheEntryError
from gateway.cache.key import (
    IGNORED_FIELDS,
    CacheScope,
    Mode,
    canonical_request,
    nondeterminism,
    request_key,
)
from gateway.cache.recorder import StreamRecorder
from gateway.cache.stats import COUNTERS, CacheStats, PurgeResult, ScopeStats
from gateway.cache.store import CacheUnavailable, Lookup, ResponseCache, StoreOutcome

__all__ = [
    "BYPASS",
    "CACHE_HEADER",
    "COUNTERS",
    "DEFAULT_DIRECTIVE",
    "HIT",
    "IGNORED_FIELDS",
    "MISS",
    "CacheDirective",
    "CacheEntry",
    "CacheEntryError",
    "CacheHeaderError",
    "CacheScope",
    "CacheStats",
    "CacheUnavailable",
    "CachedUsage",
    "Lookup",
    "Mode",
    "PurgeResult",
    "ResponseCache",
    "ScopeStats",
    "StoreOutcome",
    "StreamRecorder",
    "canonical_request",
    "directive_of",
    "nondeterminism",
    "request_key",
]
