"""Helpers for the usage-store tests: deterministic events, and the totals they must add up to.

``expected`` recomputes a report straight from a list of events (first copy of each id wins),
so a store's rollups are checked against plain Python sums, dimension by dimension.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

from gateway.ledger import RollupQuery, RollupRow, Totals, UsageEvent
from gateway.ledger.query import DIMENSION_COLUMNS

DAY0 = date(2026, 11, 1)
KEYS = ("key-a", "key-b", "key-c")
TEAMS = ("", "search", "support")
MODELS = (("gpt-4o-mini", "openai"), ("claude-sonnet", "anthropic"), ("qwen3:0.6b", "local"))
TASKS = ("chat", "code")
TAGS = ("prod", "eval", "team:ml", "batch")
USERS = ("", "alice", "bob@example.com")


def at(day: date, seconds: int = 0) -> int:
    """Epoch milliseconds of ``seconds`` after midnight UTC of ``day``."""
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return int(midnight.timestamp() * 1000) + seconds * 1000


def noon(day: date) -> float:
    """A clock reading (epoch seconds) at noon UTC of ``day``."""
    return at(day, 12 * 3600) / 1000


class Clock:
    """A settable clock for stores: ``clock.now`` is epoch seconds."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_events(count: int, *, seed: int = 1, day0: date = DAY0, days: int = 5) -> list[UsageEvent]:
    rng = random.Random(seed)
    events = []
    for index in range(count):
        day = day0 + timedelta(days=rng.randrange(days))
        model, provider = rng.choice(MODELS)
        prompt = rng.randint(0, 5000)
        events.append(
            UsageEvent(
                event_id=f"ev-{seed}-{index:06d}",
                time_ms=at(day, rng.randrange(86_400)),
                key_id=rng.choice(KEYS),
                model=model,
                provider=provider,
                team=rng.choice(TEAMS),
                task=rng.choice(TASKS),
                route="default",
                prompt_tokens=prompt,
                completion_tokens=rng.randint(0, 2000),
                cached_tokens=(cached := rng.randint(0, prompt)),
                cache_write_tokens=min(rng.choice((0, 0, rng.randint(1, 100))), prompt - cached),
                # Odd nano amounts: a float anywhere on the way would show.
                cost_nanos=rng.randint(0, 10**12) * 7 + 3,
                status=rng.choice((200, 200, 200, 429, 502)),
                streamed=rng.random() < 0.5,
                usage_source=rng.choice(("provider", "provider", "estimated")),
                attempts=rng.randint(1, 3),
                latency_ms=rng.randint(1, 30_000),
                ttft_ms=rng.choice((None, rng.randint(1, 900))),
                policy_version="v7",
                end_user=rng.choice(USERS),
                tags=tuple(rng.sample(TAGS, rng.randint(0, 3))),
            )
        )
    return events


def unique(events: Iterable[UsageEvent]) -> list[UsageEvent]:
    """First copy of each (day, event id), as the store keeps it."""
    seen: dict[tuple[date, str], UsageEvent] = {}
    for event in events:
        seen.setdefault((event.day, event.event_id), event)
    return list(seen.values())


def _values(event: UsageEvent, by: str) -> list[str]:
    """The event's value(s) of one dimension; several tags give several rows."""
    if by == "day":
        return [event.day.isoformat()]
    if by == "tag":
        return list(event.tags) or [""]
    return [getattr(event, DIMENSION_COLUMNS[by])]


def _matches(event: UsageEvent, query: RollupQuery) -> bool:
    if not query.start <= event.day < query.end:
        return False
    for name, value in query.filters.items():
        if name == "tag":
            if value not in (event.tags or ("",)):
                return False
        elif getattr(event, DIMENSION_COLUMNS.get(name, name)) != value:
            return False
    return True


def expected(events: Iterable[UsageEvent], query: RollupQuery) -> list[RollupRow]:
    """What ``store.rollup(query)`` must return for these (already unique) events."""
    groups: dict[tuple[str, ...], Totals] = {}
    for event in events:
        if not _matches(event, query):
            continue
        keys: list[tuple[str, ...]] = [()]
        for by in query.group_by:
            keys = [(*key, value) for key in keys for value in _values(event, by)]
        for key in keys:
            groups[key] = groups.get(key, Totals()) + Totals.of_event(event)
    if not query.group_by:
        return [RollupRow((), groups.get((), Totals()))]
    return [RollupRow(key, groups[key]) for key in sorted(groups)]


def with_changes(event: UsageEvent, **changes: object) -> UsageEvent:
    return replace(event, **changes)


async def raw_event_count(store: object) -> int:
    """Rows in the raw events table, read behind the store's back."""
    rows = await raw_sql(store, "SELECT count(*) FROM usage_events")
    return int(rows[0][0])


async def raw_sql(store: object, sql: str) -> list[tuple[object, ...]]:
    """Run one statement on the store's database with a connection of our own."""
    import asyncio
    import sqlite3

    import asyncpg

    if getattr(store, "kind", None) == "postgresql":
        conn = await asyncpg.connect(store.url)  # type: ignore[attr-defined]
        try:
            return [tuple(record) for record in await conn.fetch(sql)]
        finally:
            await conn.close()

    def run() -> list[tuple[object, ...]]:
        conn = sqlite3.connect(store.path, isolation_level=None)  # type: ignore[attr-defined]
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    return await asyncio.to_thread(run)


# Group-bys whose rows must survive a retention pass unchanged for the kept days.
GROUP_BYS_FOR_RETENTION = ((), ("day",), ("day", "key"), ("day", "tag"), ("day", "user", "model"))
