"""Retention on SQLite and PostgreSQL: days past the window leave the raw table and the
rollups, kept days' rollups do not change; in PostgreSQL whole day partitions are created
ahead, on demand, and dropped."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

from sqlstore_support import (
    DAY0,
    GROUP_BYS_FOR_RETENTION,
    Clock,
    make_events,
    noon,
    raw_event_count,
)

from gateway.ledger import EventQuery, RollupQuery, open_store
from gateway.ledger.postgres_store import PostgresStore

END = DAY0 + timedelta(days=5)


async def test_retention_drops_old_days_and_keeps_the_rest(open_ledger, clock: Clock) -> None:
    writer = await open_ledger()  # 400 days: takes all five days
    events = make_events(300, seed=21)
    assert await writer.insert(events) == 300
    cutoff = DAY0 + timedelta(days=2)
    kept_queries = [RollupQuery(cutoff, END, group_by) for group_by in GROUP_BYS_FOR_RETENTION]
    before = [await writer.rollup(query) for query in kept_queries]

    short = await open_ledger(retention_days=3)  # today (DAY0+4) and the two days before
    result = await short.maintain()
    assert result.cutoff == cutoff
    assert result.days_dropped == (DAY0, DAY0 + timedelta(days=1))
    expired = [event for event in events if event.day < cutoff]
    if short.kind == "sqlite":
        assert result.events_deleted == len(expired)
    else:
        assert result.events_deleted is None  # whole partitions, not counted
    assert result.rollup_rows_deleted > 0

    # Raw events of dropped days are gone; rollups of kept days are unchanged.
    assert await raw_event_count(short) == len(events) - len(expired)
    page = await short.list_events(EventQuery(limit=1000))
    assert {event.event_id for event in page.events} == {
        event.event_id for event in events if event.day >= cutoff
    }
    assert [await short.rollup(query) for query in kept_queries] == before
    old = await short.rollup(RollupQuery(DAY0, cutoff, ("day",)))
    assert old == []

    # An event already past the window is not stored again; a second pass finds nothing.
    assert await short.insert(expired[:5]) == 0
    again = await short.maintain()
    assert (again.days_dropped, again.rollup_rows_deleted) == ((), 0)

    # The next day, one more day goes; the days after it stay as they were.
    later = [RollupQuery(cutoff + timedelta(days=1), END, g) for g in GROUP_BYS_FOR_RETENTION]
    later_before = [await short.rollup(query) for query in later]
    clock.now += 86_400
    result = await short.maintain()
    assert result.days_dropped == (cutoff,)
    assert await short.rollup(RollupQuery(DAY0, cutoff + timedelta(days=1), ("day",))) == []
    assert [await short.rollup(query) for query in later] == later_before


async def test_postgres_partitions_ahead_on_demand_and_dropped(
    postgres_url: str, tmp_path: Path
) -> None:
    clock = Clock(noon(DAY0 + timedelta(days=4)))
    store = await open_store(postgres_url, data_dir=tmp_path, clock=clock)
    short = await open_store(postgres_url, data_dir=tmp_path, clock=clock, retention_days=3)
    assert isinstance(store, PostgresStore) and isinstance(short, PostgresStore)
    try:
        today = DAY0 + timedelta(days=4)
        assert await store.partitions() == [today + timedelta(days=n) for n in range(4)]

        events = make_events(100, seed=31)
        await store.insert(events)  # days 0-3 get their partitions on demand
        assert await store.partitions() == [DAY0 + timedelta(days=n) for n in range(8)]

        await short.maintain()
        assert await short.partitions() == [DAY0 + timedelta(days=n) for n in range(2, 8)]

        # ``store`` still believes in day 0's partition (its cache is stale) and keeps 400
        # days: its insert finds the partition gone, looks again, recreates it and succeeds.
        late = [event for event in events if event.day == DAY0][:3]
        fresh = [dataclasses.replace(e, event_id=e.event_id + "-late") for e in late]
        assert await store.insert(fresh) == len(fresh)
        assert DAY0 in await store.partitions()

        # A day later the retention pass creates the new day ahead and drops the oldest kept.
        clock.now += 86_400
        await short.maintain()
        days = await short.partitions()
        assert days[0] == DAY0 + timedelta(days=3)
        assert days[-1] == today + timedelta(days=4)
    finally:
        await short.close()
        await store.close()
