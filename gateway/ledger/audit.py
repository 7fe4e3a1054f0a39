"""The admin audit log's table, in the SQL store beside usage (schema version 2).

One row per admin action: when (``time_ms``, and its UTC ``day`` for retention), who
(``actor_kind`` bootstrap | token | cli, ``actor_id``, ``actor_name``, ``actor_role``), what
(``action`` such as ``key.rotate``, ``target`` such as ``key:<id>``), from where (``client``,
``request_id``) and the values before and after (``before_json``, ``after_json``), which the caller has
already scrubbed of secrets. The table is append-only: an UPDATE fails in both backends (a
trigger), and the only DELETE is retention's, whole days past ``usage_retention_days``, as for
usage. PostgreSQL indexes it by time rather than partitioning it: admin actions are few.

``open_audit_store(url, data_dir=..., retention_days=...)`` (in ``backends.py``, which picks
a store by its URL) opens the usage store once (which
applies every pending migration, this table's included) and returns an ``AuditStore``:
``insert`` (idempotent by ``event_id``), ``query`` (filters, newest first, an opaque cursor)
and ``apply_retention``. SQLite opens a connection per call on a worker thread (admin actions
are rare; no thread stays behind), PostgreSQL keeps a pool of two.
"""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, astuple, dataclass, fields
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import asyncpg

from gateway.ledger.event import EPOCH_DAY
from gateway.ledger.query import LedgerQueryError, decode_position
from gateway.ledger.store import (
    retention_cutoff,
)

MAX_AUDIT_LIMIT = 1000
_BUSY_TIMEOUT_S = 30

SQLITE_MIGRATION = """
CREATE TABLE admin_audit (
  event_id TEXT NOT NULL PRIMARY KEY,
  time_ms INTEGER NOT NULL,
  day INTEGER NOT NULL,
  actor_kind TEXT NOT NULL,
  actor_id TEXT NOT NULL,
  actor_name TEXT NOT NULL,
  actor_role TEXT NOT NULL,
  action TEXT NOT NULL,
  target TEXT NOT NULL,
  client TEXT NOT NULL,
  request_id TEXT NOT NULL,
  before_json TEXT,
  after_json TEXT
) STRICT;
CREATE INDEX admin_audit_time ON admin_audit (time_ms, event_id);
CREATE INDEX admin_audit_day ON admin_audit (day);
CREATE TRIGGER admin_audit_append_only BEFORE UPDATE ON admin_audit
BEGIN
  SELECT RAISE(ABORT, 'admin_audit is append-only');
END;
"""

POSTGRES_MIGRATION = """
CREATE TABLE admin_audit (
  event_id text NOT NULL PRIMARY KEY,
  time_ms bigint NOT NULL,
  day date NOT NULL,
  actor_kind text NOT NULL,
  actor_id text NOT NULL,
  actor_name text NOT NULL,
  actor_role text NOT NULL,
  action text NOT NULL,
  target text NOT NULL,
  client text NOT NULL,
  request_id text NOT NULL,
  before_json text,
  after_json text
);
CREATE INDEX admin_audit_time ON admin_audit (time_ms, event_id);
CREATE INDEX admin_audit_day ON admin_audit (day);
CREATE FUNCTION admin_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'admin_audit is append-only';
END
$$;
CREATE TRIGGER admin_audit_append_only BEFORE UPDATE ON admin_audit
  FOR EACH ROW EXECUTE FUNCTION admin_audit_append_only();
"""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    event_id: str
    time_ms: int
    actor_kind: str
    actor_id: str
    actor_name: str
    actor_role: str
    action: str
    target: str
    client: str
    request_id: str
    before_json: str | None  # scrubbed of secrets by the caller
    after_json: str | None

    @property
    def day(self) -> date:
        return datetime.fromtimestamp(self.time_ms / 1000, UTC).date()

    def view(self) -> dict[str, Any]:
        return asdict(self)


_COLUMNS = tuple(f.name for f in fields(AuditEntry))
_INSERT_COLUMNS = (*_COLUMNS, "day")


class AuditQueryError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(frozen=True)
class AuditQuery:
    """Newest first. ``actor`` matches an actor's id or name; ``start_ms``/``end_ms`` bound the
    time (end exclusive); ``cursor`` is a page's ``next_cursor``."""

    actor: str | None = None
    action: str | None = None
    target: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    cursor: str | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_AUDIT_LIMIT:
            raise AuditQueryError("limit", f"must be from 1 to {MAX_AUDIT_LIMIT}")
        if self.cursor is not None:
            decode_cursor(self.cursor)


@dataclass(frozen=True)
class AuditPage:
    entries: list[AuditEntry]
    next_cursor: str | None


def encode_cursor(entry: AuditEntry) -> str:
    raw = f"{entry.time_ms}|{entry.event_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """The position of a page's ``next_cursor`` (checked as the events' cursors are)."""
    try:
        return decode_position(cursor)
    except LedgerQueryError as exc:
        raise AuditQueryError(exc.param, exc.message) from None


def query_sql(query: AuditQuery, mark: Callable[[int], str]) -> tuple[str, list[Any]]:
    """The SELECT of one page (one row more than the limit, to know if another page exists)."""
    where: list[str] = []
    params: list[Any] = []

    def bind(value: Any) -> str:
        params.append(value)
        return mark(len(params))

    if query.actor:
        where.append(f"(actor_id = {bind(query.actor)} OR actor_name = {bind(query.actor)})")
    if query.action:
        where.append(f"action = {bind(query.action)}")
    if query.target:
        where.append(f"target = {bind(query.target)}")
    if query.start_ms is not None:
        where.append(f"time_ms >= {bind(query.start_ms)}")
    if query.end_ms is not None:
        where.append(f"time_ms < {bind(query.end_ms)}")
    if query.cursor:
        time_ms, event_id = decode_cursor(query.cursor)
        where.append(f"(time_ms, event_id) < ({bind(time_ms)}, {bind(event_id)})")
    sql = f"SELECT {', '.join(_COLUMNS)} FROM admin_audit"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY time_ms DESC, event_id DESC LIMIT {bind(query.limit + 1)}"
    return sql, params


def page_of(rows: Sequence[Sequence[Any]], limit: int) -> AuditPage:
    entries = [AuditEntry(*row) for row in rows]
    if len(entries) > limit:
        entries = entries[:limit]
        return AuditPage(entries, encode_cursor(entries[-1]))
    return AuditPage(entries, None)


class AuditStore(Protocol):
    kind: str
    retention_days: int

    async def insert(self, entries: Sequence[AuditEntry]) -> int:
        """Store entries not stored yet (by ``event_id``); returns how many were new."""
        ...

    async def query(self, query: AuditQuery) -> AuditPage: ...

    async def apply_retention(self, today: date | None = None) -> int:
        """Delete the days past retention; returns how many entries went."""
        ...

    async def close(self) -> None: ...


class SqliteAudit:
    kind = "sqlite"

    def __init__(self, path: Path, retention_days: int) -> None:
        self.path = path
        self.retention_days = retention_days

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=_BUSY_TIMEOUT_S)
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_S * 1000}")
        conn.execute("PRAGMA synchronous = FULL")  # an acknowledged entry survives power loss
        return conn

    async def _run(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        def call() -> Any:
            conn = self._connect()
            try:
                return work(conn)
            finally:
                conn.close()

        return await asyncio.to_thread(call)

    async def insert(self, entries: Sequence[AuditEntry]) -> int:
        rows = [(*astuple(e), (e.day - EPOCH_DAY).days) for e in entries]
        sql = (
            f"INSERT INTO admin_audit ({', '.join(_INSERT_COLUMNS)})"
            f" VALUES ({', '.join('?' for _ in _INSERT_COLUMNS)}) ON CONFLICT DO NOTHING"
        )

        def work(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                inserted = sum(conn.execute(sql, row).rowcount for row in rows)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return inserted

        return await self._run(work)

    async def query(self, query: AuditQuery) -> AuditPage:
        sql, params = query_sql(query, lambda _: "?")
        rows = await self._run(lambda conn: conn.execute(sql, params).fetchall())
        return page_of(rows, query.limit)

    async def apply_retention(self, today: date | None = None) -> int:
        cutoff = retention_cutoff(today or datetime.now(UTC).date(), self.retention_days)
        limit = (cutoff - EPOCH_DAY).days
        return await self._run(
            lambda conn: conn.execute("DELETE FROM admin_audit WHERE day < ?", (limit,)).rowcount
        )

    async def close(self) -> None:
        return None


class PostgresAudit:
    kind = "postgresql"

    def __init__(self, pool: asyncpg.Pool, retention_days: int) -> None:
        self.pool = pool
        self.retention_days = retention_days

    async def insert(self, entries: Sequence[AuditEntry]) -> int:
        sql = (
            f"INSERT INTO admin_audit ({', '.join(_INSERT_COLUMNS)})"
            f" VALUES ({', '.join(f'${i + 1}' for i in range(len(_INSERT_COLUMNS)))})"
            " ON CONFLICT DO NOTHING"
        )
        inserted = 0
        async with self.pool.acquire() as conn, conn.transaction():
            for entry in entries:
                status = await conn.execute(sql, *astuple(entry), entry.day)
                inserted += int(status.rsplit(" ", 1)[-1])
        return inserted

    async def query(self, query: AuditQuery) -> AuditPage:
        sql, params = query_sql(query, lambda index: f"${index}")
        rows = await self.pool.fetch(sql, *params)
        return page_of([tuple(row) for row in rows], query.limit)

    async def apply_retention(self, today: date | None = None) -> int:
        cutoff = retention_cutoff(today or datetime.now(UTC).date(), self.retention_days)
        status = await self.pool.execute("DELETE FROM admin_audit WHERE day < $1", cutoff)
        return int(status.rsplit(" ", 1)[-1])

    async def close(self) -> None:
        await self.pool.close()


def day_start_ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)


def days_range_ms(start: date | None, end: date | None) -> tuple[int | None, int | None]:
    """``from``/``to`` days (UTC, inclusive) as a time range in ms (end exclusive)."""
    return (
        day_start_ms(start) if start else None,
        day_start_ms(end + timedelta(days=1)) if end else None,
    )


def now_ms() -> int:
    return int(time.time() * 1000)
