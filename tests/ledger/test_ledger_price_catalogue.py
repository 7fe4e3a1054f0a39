"""The price catalogue an event was costed from (migration 5, ``price_catalogue``), on SQLite and
PostgreSQL alike: written and read back, and added to a store made before it, whose events
then read as costed at the policy's own prices ("")."""

from __future__ import annotations

import dataclasses

from sqlstore_support import make_events, raw_sql, with_changes

from gateway.ledger import EventQuery, UsageEvent
from gateway.ledger.sqlite_store import SCHEMA_VERSION

CATALOGUE = "genai-prices 0.2.3"


async def test_a_store_made_before_the_column_gains_it(open_ledger) -> None:
    store = await open_ledger()
    old = make_events(5, seed=3)
    await store.insert(old)
    # Back to schema 4, behind the store's back: as a store of the release before the column
    # (and before the batch tables of migrations 6 and 7).
    await raw_sql(store, "ALTER TABLE usage_events DROP COLUMN price_catalogue")
    for table in ("batch_natives", "batch_lines", "batches", "batch_file_chunks", "batch_files"):
        await raw_sql(store, f"DROP TABLE {table}")
    await raw_sql(store, "DELETE FROM usage_schema_version WHERE version >= 5")
    await store.close()
    reopened = await open_ledger()
    assert await reopened.schema_version() == SCHEMA_VERSION == 7
    new = [with_changes(e, price_catalogue=CATALOGUE) for e in make_events(4, seed=9)]
    assert await reopened.insert(new) == 4
    page = await reopened.list_events(EventQuery(limit=50))
    by_id = {event.event_id: event for event in page.events}
    assert {by_id[e.event_id].price_catalogue for e in old} == {""}
    assert [by_id[e.event_id] for e in new] == new


def test_every_field_survives_the_json_form_the_buffer_and_spool_carry() -> None:
    """The recorder sends each event to Redis (and the spool) as JSON: a field the JSON form
    leaves out is lost on the way to the store, however well the store keeps it."""
    event = with_changes(
        make_events(1, seed=5)[0],
        price_catalogue=CATALOGUE,
        end_user="u-1",
        tags=("a", "b"),
        team="t",
        cache_write_tokens=1,
        status=500,
        usage_source="estimated",
        ttft_ms=7,
    )
    assert all(
        getattr(event, field.name) != field.default
        for field in dataclasses.fields(event)
        if field.default is not dataclasses.MISSING
    ), "every optional field set, so that a dropped one shows"
    assert UsageEvent.from_json(event.to_json()) == event
    unpriced = with_changes(event, price_catalogue="")
    assert "price_catalogue" not in UsageEvent.from_json(unpriced.to_json()).to_dict()
