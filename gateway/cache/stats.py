"""Counters of the response cache, per scope and in total (what /admin/cache shows).

Each scope (namespace, model) counts in Redis, in its own stats hash, updated by the scripts
that already run (the lookup counts hit/miss in its one round trip). ``entries`` is the number
of live entries at the time of reading. Counters of a scope unused for a day (or its TTL, when
longer) expire with the scope.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict


class Counters(TypedDict):
    hit: int
    miss: int
    bypass: int
    store: int
    skip_nondeterministic: int
    skip_too_large: int
    skip_incomplete: int
    skip_no_store: int
    skip_purged: int


class CountedView(Counters):
    entries: int
    hit_ratio: float | None


class ScopeView(CountedView):
    namespace: str
    model: str


class CacheStatsView(CountedView):
    """What ``GET /admin/cache`` shows: the totals, and each scope's."""

    scopes: list[ScopeView]


class PurgeView(TypedDict):
    scopes: int
    entries: int


# Every counter a scope keeps (the hash's other fields are namespace, model and epoch).
COUNTERS: tuple[str, ...] = tuple(Counters.__annotations__)
# What a caller may count without a lookup or a store (``ResponseCache.note``).
NOTE_KINDS = frozenset(COUNTERS) - {"hit", "miss", "store", "skip_purged"}


class _Counted:
    """What a scope and the total both show: live entries, hit ratio, counters."""

    entries: int
    counters: dict[str, int]

    @property
    def hit_ratio(self) -> float | None:
        looked_up = self.counters["hit"] + self.counters["miss"]
        return self.counters["hit"] / looked_up if looked_up else None

    def _view(self) -> CountedView:
        return {"entries": self.entries, "hit_ratio": self.hit_ratio, **self.counters}  # type: ignore[typeddict-item]


@dataclass(frozen=True)
class ScopeStats(_Counted):
    namespace: str
    model: str
    entries: int
    counters: dict[str, int]

    def to_dict(self) -> ScopeView:
        return ScopeView(namespace=self.namespace, model=self.model, **self._view())


@dataclass(frozen=True)
class CacheStats(_Counted):
    scopes: list[ScopeStats] = field(default_factory=list)

    @property
    def entries(self) -> int:  # type: ignore[override]
        return sum(scope.entries for scope in self.scopes)

    @property
    def counters(self) -> dict[str, int]:  # type: ignore[override]
        return {name: sum(scope.counters[name] for scope in self.scopes) for name in COUNTERS}

    def to_dict(self) -> CacheStatsView:
        return CacheStatsView(**self._view(), scopes=[scope.to_dict() for scope in self.scopes])


@dataclass(frozen=True)
class PurgeResult:
    scopes: int
    entries: int

    def to_dict(self) -> PurgeView:
        return PurgeView(scopes=self.scopes, entries=self.entries)
