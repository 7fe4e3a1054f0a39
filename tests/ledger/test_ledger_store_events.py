"""Raw-event pages on SQLite and PostgreSQL: newest first, cursor pagination without gaps or
repeats, filters by key, model and date range."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlstore_support import DAY0, make_events, with_changes

from gateway.ledger import EventQuery, LedgerQueryError, UsageStore


def newest_first(events: list) -> list:
    return sorted(events, key=lambda event: (event.time_ms, event.event_id), reverse=True)


async def all_pages(store: UsageStore, **options: object) -> tuple[list, int]:
    seen, pages, cursor = [], 0, None
    while True:
        page = await store.list_events(EventQuery(cursor=cursor, **options))  # type: ignore[arg-type]
        seen.extend(page.events)
        pages += 1
        if not page.has_more:
            return seen, pages
        cursor = page.next_cursor


async def test_pages_cover_every_event_once_newest_first(store: UsageStore) -> None:
    events = make_events(95, seed=4)
    # Ties on time are broken by event id, so equal timestamps never split or repeat.
    events += [with_changes(events[0], event_id=f"tie-{index}") for index in range(6)]
    await store.insert(events)
    seen, pages = await all_pages(store, limit=10)
    assert pages == 11
    assert seen == newest_first(events)


async def test_filters_and_date_range(store: UsageStore) -> None:
    events = make_events(150, seed=8)
    await store.insert(events)
    by_key, _ = await all_pages(store, key_id="key-c", limit=7)
    assert by_key == newest_first([e for e in events if e.key_id == "key-c"])
    by_model, _ = await all_pages(store, model="claude-sonnet", limit=50)
    assert by_model == newest_first([e for e in events if e.model == "claude-sonnet"])
    start, end = DAY0 + timedelta(days=1), DAY0 + timedelta(days=3)
    in_range, _ = await all_pages(store, start=start, end=end, key_id="key-a", limit=9)
    assert in_range == newest_first(
        [e for e in events if start <= e.day < end and e.key_id == "key-a"]
    )
    assert in_range
    since, _ = await all_pages(store, start=DAY0 + timedelta(days=4), limit=1000)
    assert since == newest_first([e for e in events if e.day >= DAY0 + timedelta(days=4)])


async def test_bad_page_parameters_are_refused(store: UsageStore) -> None:
    with pytest.raises(LedgerQueryError) as bad_cursor:
        await store.list_events(EventQuery(cursor="not-a-cursor"))
    assert bad_cursor.value.param == "cursor"
    for limit in (0, 1001, "10", True):
        with pytest.raises(LedgerQueryError) as bad_limit:
            EventQuery(limit=limit)  # type: ignore[arg-type]
        assert bad_limit.value.param == "limit"
    with pytest.raises(LedgerQueryError) as backwards:
        EventQuery(start=DAY0, end=DAY0)
    assert backwards.value.param == "to"
