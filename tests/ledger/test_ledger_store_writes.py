"""Usage store writes, on SQLite and PostgreSQL alike: idempotent by event id, rollups exact
under concurrent writers (tasks and processes), events read back exactly as written."""

from __future__ import annotations

import asyncio
import random
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlstore_support import (
    DAY0,
    expected,
    make_events,
    raw_event_count,
    unique,
    with_changes,
)

from gateway.ledger import EventQuery, RollupQuery, UsageError, UsageStore
from gateway.ledger.sqlite_store import SCHEMA_VERSION

WHOLE_RANGE = RollupQuery(DAY0, DAY0 + timedelta(days=5))
WRITER = Path(__file__).with_name("sqlstore_writer.py")


async def assert_rollups_match(store: UsageStore, events: list) -> None:
    for group_by in ((), ("key",), ("day", "model"), ("tag",), ("user",)):
        query = RollupQuery(WHOLE_RANGE.start, WHOLE_RANGE.end, group_by)
        assert await store.rollup(query) == expected(events, query), group_by


async def test_insert_counts_each_event_id_once(store: UsageStore) -> None:
    events = make_events(120)
    assert await store.insert(events[:80]) == 80
    # A re-delivery overlapping the first batch, with a duplicate inside the batch itself.
    assert await store.insert([*events[40:], events[100], events[0]]) == 40
    assert await store.insert(events) == 0
    assert await raw_event_count(store) == 120
    await assert_rollups_match(store, events)


async def test_a_redelivered_id_keeps_the_first_copy(store: UsageStore) -> None:
    first = make_events(1)[0]
    assert await store.insert([first]) == 1
    changed = with_changes(
        first, prompt_tokens=first.prompt_tokens + 1, cost_nanos=1, tags=("eval",)
    )
    assert await store.insert([changed]) == 0
    page = await store.list_events(EventQuery())
    assert page.events == [first]
    await assert_rollups_match(store, [first])


async def test_empty_batch_and_wrong_items(store: UsageStore) -> None:
    assert await store.insert([]) == 0
    with pytest.raises(UsageError, match="event: item 1 is a dict"):
        await store.insert([make_events(1)[0], {"event_id": "x"}])  # type: ignore[list-item]
    assert await raw_event_count(store) == 0  # nothing of a refused batch is kept


async def test_concurrent_writers_in_one_process_are_exact(open_ledger) -> None:
    events = make_events(800, seed=3)
    stores = [await open_ledger() for _ in range(4)]

    async def write(store: UsageStore, seed: int) -> int:
        # Each writer sends 400 events, overlapping its neighbours', in its own order.
        rng = random.Random(seed)
        start = seed * 134  # windows 0-400, 134-534, 268-668, 402-800
        mine = events[start : start + 400] + events[:20]
        rng.shuffle(mine)
        inserted = 0
        for offset in range(0, len(mine), 37):
            inserted += await store.insert(mine[offset : offset + 37])
        return inserted

    counts = await asyncio.gather(*(write(store, seed) for seed, store in enumerate(stores)))
    assert sum(counts) == 800  # every event counted by exactly one writer
    assert await raw_event_count(stores[0]) == 800
    await assert_rollups_match(stores[0], events)


async def test_concurrent_writer_processes_are_exact(store_url: str, store: UsageStore) -> None:
    count = 600
    windows = [(0, 300), (150, 450), (300, 600)]  # each event sent by one or two processes
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WRITER),
            store_url,
            "9",
            str(count),
            str(start),
            str(stop),
            "50",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=WRITER.parent,
        )
        for start, stop in windows
    ]
    outputs = [await process.communicate() for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr.decode()[-2000:]
    assert sum(int(stdout) for stdout, _ in outputs) == count
    assert await raw_event_count(store) == count
    await assert_rollups_match(store, make_events(count, seed=9))


async def test_events_read_back_exactly_as_written(store: UsageStore) -> None:
    events = make_events(60, seed=5)
    await store.insert(events)
    page = await store.list_events(EventQuery(limit=100))
    assert sorted(page.events, key=lambda e: e.event_id) == sorted(events, key=lambda e: e.event_id)
    assert any(event.ttft_ms is None for event in page.events)
    assert any(len(event.tags) >= 2 for event in page.events)


async def test_reopening_keeps_data_and_schema_version(open_ledger) -> None:
    first = await open_ledger()
    events = make_events(30)
    await first.insert(events)
    # Several stores opening at once (replicas starting together) migrate exactly once.
    others = await asyncio.gather(*(open_ledger() for _ in range(3)))
    for store in (first, *others):
        assert await store.schema_version() == SCHEMA_VERSION  # all four versions
    # One identity per store, made once: every replica of it reads the same.
    assert len(first.store_id) == 16 and int(first.store_id, 16) >= 0
    assert {store.store_id for store in others} == {first.store_id}
    assert await others[0].insert(events) == 0
    await assert_rollups_match(others[1], unique(events))
