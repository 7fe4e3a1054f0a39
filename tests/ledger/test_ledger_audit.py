"""The admin audit table (schema version 2), on SQLite and on PostgreSQL alike: entries are
stored once by id, read back newest first through every filter and page, refuse any UPDATE
(append-only), and leave with retention by whole days, as usage does."""

from __future__ import annotations

import sqlite3
from datetime import date, timedelta
from pathlib import Path

import asyncpg
import pytest
from sqlstore_support import at

from gateway.ledger.audit import (
    AuditEntry,
    AuditQuery,
    AuditQueryError,
    AuditStore,
    PostgresAudit,
    SqliteAudit,
)
from gateway.ledger.backends import open_audit_store

DAY0 = date(2026, 11, 1)


@pytest.fixture
async def audit(store_url: str, tmp_path: Path) -> AuditStore:
    store = await open_audit_store(store_url, data_dir=tmp_path, retention_days=30)
    yield store
    await store.close()


def _entry(n: int, day: date = DAY0, **fields: str) -> AuditEntry:
    values = {
        "event_id": f"e{n:04d}",
        "time_ms": at(day, n),
        "actor_kind": "token",
        "actor_id": f"tok{n % 3}",
        "actor_name": ("ana", "bo", "cy")[n % 3],
        "actor_role": "operator",
        "action": ("key.create", "key.rotate", "team.update")[n % 3],
        "target": f"key:k{n % 5}",
        "client": "10.0.0.1",
        "request_id": f"req{n}",
        "before_json": None if n % 3 == 0 else '{"rpm": 1}',
        "after_json": '{"rpm": 2}',
    }
    return AuditEntry(**(values | fields))


async def test_entries_are_stored_once_and_read_back_newest_first(audit: AuditStore) -> None:
    entries = [_entry(n) for n in range(30)]
    assert await audit.insert(entries[:20]) == 20
    assert await audit.insert(entries) == 10  # a replay of the first 20 adds nothing
    page = await audit.query(AuditQuery(limit=1000))
    assert [e.event_id for e in page.entries] == [e.event_id for e in reversed(entries)]
    assert page.entries[0] == entries[-1] and page.next_cursor is None


async def test_filters_and_pages(audit: AuditStore) -> None:
    entries = [_entry(n) for n in range(12)] + [
        _entry(n, DAY0 + timedelta(days=1)) for n in range(12, 20)
    ]
    await audit.insert(entries)

    async def ids(**filters: object) -> list[str]:
        found, cursor = [], None
        while True:
            page = await audit.query(AuditQuery(cursor=cursor, limit=3, **filters))
            found += [e.event_id for e in page.entries]
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    def expected(keep) -> list[str]:
        return [e.event_id for e in sorted(entries, key=lambda e: -e.time_ms) if keep(e)]

    assert await ids() == expected(lambda e: True)
    assert await ids(actor="bo") == expected(lambda e: e.actor_name == "bo")
    assert await ids(actor="tok1") == expected(lambda e: e.actor_id == "tok1")
    assert await ids(action="key.rotate") == expected(lambda e: e.action == "key.rotate")
    assert await ids(target="key:k2", action="key.create") == expected(
        lambda e: e.target == "key:k2" and e.action == "key.create"
    )
    next_day = at(DAY0 + timedelta(days=1))
    assert await ids(start_ms=next_day) == expected(lambda e: e.time_ms >= next_day)
    assert await ids(end_ms=next_day) == expected(lambda e: e.time_ms < next_day)
    with pytest.raises(AuditQueryError):
        AuditQuery(cursor="not-a-cursor")
    with pytest.raises(AuditQueryError):
        AuditQuery(limit=0)


async def test_the_table_is_append_only(audit: AuditStore) -> None:
    await audit.insert([_entry(1)])
    if isinstance(audit, SqliteAudit):
        with (
            sqlite3.connect(audit.path) as conn,
            pytest.raises(sqlite3.IntegrityError, match="append-only"),
        ):
            conn.execute("UPDATE admin_audit SET actor_name = 'mallory'")
    else:
        assert isinstance(audit, PostgresAudit)
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await audit.pool.execute("UPDATE admin_audit SET actor_name = 'mallory'")
    page = await audit.query(AuditQuery())
    assert page.entries[0].actor_name == "bo"


async def test_retention_drops_whole_days_past_the_usage_window(audit: AuditStore) -> None:
    old = [_entry(n, DAY0) for n in range(5)]
    kept = [_entry(n, DAY0 + timedelta(days=1)) for n in range(5, 9)]
    await audit.insert(old + kept)
    # 30 days kept, today included: on DAY0 + 30 the first kept day is DAY0 + 1.
    assert await audit.apply_retention(DAY0 + timedelta(days=30)) == 5
    left = await audit.query(AuditQuery(limit=100))
    assert sorted(e.event_id for e in left.entries) == sorted(e.event_id for e in kept)
    assert await audit.apply_retention(DAY0 + timedelta(days=30)) == 0
