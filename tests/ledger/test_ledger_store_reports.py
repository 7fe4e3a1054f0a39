"""Rollup queries on SQLite and PostgreSQL: every dimension, every filter, half-open date
ranges, exact integers, and never a read of raw events."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from sqlstore_support import DAY0, expected, make_events, raw_event_count, raw_sql

from gateway.ledger import GROUP_BYS, RollupQuery, RollupRow, Totals, UsageFilter, UsageStore

END = DAY0 + timedelta(days=5)


@pytest.fixture
async def loaded(store: UsageStore) -> tuple[UsageStore, list]:
    events = make_events(400, seed=11)
    for offset in range(0, len(events), 90):
        await store.insert(events[offset : offset + 90])
    return store, events


async def test_group_by_every_dimension(loaded) -> None:
    store, events = loaded
    for by in GROUP_BYS:
        query = RollupQuery(DAY0, END, (by,))
        rows = await store.rollup(query)
        assert rows == expected(events, query), by
        assert len(rows) > 1, by
    # Two dimensions at once, and the grand total.
    for group_by in (("day", "model"), ("team", "tag"), ("key", "user", "provider"), ()):
        query = RollupQuery(DAY0, END, group_by)
        assert await store.rollup(query) == expected(events, query), group_by


async def test_a_request_with_two_tags_counts_in_both(store: UsageStore) -> None:
    event = make_events(1)[0]
    tagged = dataclasses.replace(event, tags=("prod", "eval"))
    await store.insert([tagged])
    rows = await store.rollup(RollupQuery(DAY0, END, ("tag",)))
    assert [row.group for row in rows] == [("eval",), ("prod",)]
    assert rows[0].totals == rows[1].totals == Totals.of_event(tagged)
    # The plain total still counts the request once.
    (total,) = await store.rollup(RollupQuery(DAY0, END))
    assert total.totals.requests == 1


async def test_filters_alone_and_combined(loaded) -> None:
    store, events = loaded
    filters = [
        UsageFilter(key_id="key-b"),
        UsageFilter(team="search"),
        UsageFilter(team=""),
        UsageFilter(model="qwen3:0.6b"),
        UsageFilter(provider="anthropic"),
        UsageFilter(task="code"),
        UsageFilter(tag="team:ml"),
        UsageFilter(tag=""),
        UsageFilter(user="bob@example.com"),
        UsageFilter(key_id="key-a", model="gpt-4o-mini", task="chat"),
        UsageFilter(tag="prod", team="support", provider="openai"),
        UsageFilter(user="alice", key_id="key-c"),
        UsageFilter(key_id="no-such-key"),
    ]
    for usage_filter in filters:
        for group_by in ((), ("day",), ("model",)):
            query = RollupQuery(DAY0, END, group_by, usage_filter)
            assert await store.rollup(query) == expected(events, query), (usage_filter, group_by)


async def test_date_range_is_half_open(loaded) -> None:
    store, events = loaded
    one_day = RollupQuery(DAY0 + timedelta(days=2), DAY0 + timedelta(days=3), ("day",))
    rows = await store.rollup(one_day)
    assert [row.group for row in rows] == [((DAY0 + timedelta(days=2)).isoformat(),)]
    assert rows == expected(events, one_day)
    # A range with no data: no groups, and a grand total of zeros.
    later = END + timedelta(days=10)
    assert await store.rollup(RollupQuery(END, later, ("key",))) == []
    assert await store.rollup(RollupQuery(END, later)) == [RollupRow((), Totals())]


async def test_totals_are_exact_integers(store: UsageStore) -> None:
    base = make_events(3, seed=2)
    # Sums past 2**53 (where a float would drop the last digits) stay exact.
    big = [
        dataclasses.replace(event, cost_nanos=10**18 - index, prompt_tokens=2**40)
        for index, event in enumerate(base)
    ]
    await store.insert(big)
    (row,) = await store.rollup(RollupQuery(DAY0, END))
    assert row.totals.cost_nanos == 3 * 10**18 - 3
    assert row.totals.prompt_tokens == 3 * 2**40
    assert all(type(value) is int for value in row.totals.values())


async def test_reports_never_read_raw_events(loaded) -> None:
    store, _ = loaded
    queries = [RollupQuery(DAY0, END, (by,)) for by in GROUP_BYS]
    queries.append(RollupQuery(DAY0, END, (), UsageFilter(tag="prod", key_id="key-a")))
    before = [await store.rollup(query) for query in queries]
    # Empty the raw table behind the store's back: the reports must not change.
    await raw_sql(store, "DELETE FROM usage_events")
    assert await raw_event_count(store) == 0
    assert [await store.rollup(query) for query in queries] == before
