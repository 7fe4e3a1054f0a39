"""The usage benchmark's export round on a real Redis and a SQLite store: every generated event
lands in the store once and the buffer is left empty (``make bench-usage`` runs it at size on
PostgreSQL and SQLite and reports events/s in docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

from bench.usage import export_round, make_usage_events
from gateway.ledger import open_store
from gateway.ledger.query import MAX_EVENTS_LIMIT, EventQuery


async def test_export_round_moves_every_event_into_the_store(
    clean_redis: str, tmp_path: Path
) -> None:
    events = make_usage_events(1500, seed=7)
    assert len({event.event_id for event in events}) == 1500
    store = await open_store("", data_dir=tmp_path)
    try:
        rate, cpu_us = await export_round(clean_redis, store, events, batch=400, exporters=2)
        rows, cursor = [], None
        while True:
            page = await store.list_events(EventQuery(cursor=cursor, limit=MAX_EVENTS_LIMIT))
            rows += page.events
            if not (cursor := page.next_cursor):
                break
    finally:
        await store.close()
    assert rate > 0 and cpu_us > 0
    assert sorted(row.event_id for row in rows) == sorted(e.event_id for e in events)
    assert sum(row.cost_nanos for row in rows) == sum(e.cost_nanos for e in events)
