"""The usage store in an embedded SQLite file (the default: ``DATA_DIR/usage/usage.sqlite3``).

The stdlib ``sqlite3`` module runs on two dedicated threads, each owning one connection: a
writer and a reader (WAL lets reports read while a batch is written). The event loop only
awaits a future per operation, and a whole batch (its event rows, rollup upserts and commit) is
one hop to the writer thread; aiosqlite would hop once per statement for the same work.

Journal: WAL with ``synchronous=FULL``: the WAL is fsynced at every commit, so a batch the
store has acknowledged survives power loss, not only a crash of the process. The exporter trims
its Redis buffer once ``insert`` returns, so an acknowledged batch must not be lost. With one
commit per batch the fsync costs little (``bench.ledger`` times FULL against NORMAL).

Writes use ``BEGIN IMMEDIATE`` with a busy timeout, so several processes may share the file.
An event row that ``ON CONFLICT DO NOTHING`` skipped (``rowcount`` 0) adds nothing to the
rollups, which are summed in Python from the inserted rows and upserted in the same
transaction. Retention deletes expired days by the day index in short chunks, so writers are
never held up for long.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from pathlib import Path
from typing import Any, TypeVar, Unpack

import orjson
import structlog

from gateway.ledger.audit import SQLITE_MIGRATION as AUDIT_MIGRATION
from gateway.ledger.batch_tables import SQLITE_MIGRATION as BATCH_MIGRATION
from gateway.ledger.batch_tables import SQLITE_NATIVE_MIGRATION as NATIVE_BATCH_MIGRATION
from gateway.ledger.dead_letters import SQLITE_MIGRATION as DEAD_LETTER_MIGRATION
from gateway.ledger.event import EPOCH_DAY, UsageEvent
from gateway.ledger.query import event_counts
from gateway.ledger.store import (
    RetentionResult,
    SqlDialect,
    SqlStore,
    StoreConfigError,
    StoreOptions,
    versions_to_apply,
)
from gateway.ledger.tables import (
    COUNTERS,
    EVENT_COLUMNS,
    ROLLUP_TABLES,
    row_values,
    usage_schema_sql,
)

log = structlog.get_logger(__name__)
T = TypeVar("T")

SYNCHRONOUS_MODES = ("FULL", "NORMAL")
# The writer thread gives up the CPU every YIELD_EVERY_S of a round. Each statement releases
# the GIL, but on a core shared with the event loop this thread ran on and took it straight
# back, so a request that came in while a round was stored waited up to the 5 ms switch
# interval. Not after every event: on a saturated core the buffer then fell behind (7,006 and
# 10,685 events left after 10 s at c64, against a few hundred; docs/benchmarks.md).
YIELD_EVERY_S = 0.0005
_yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: None)
BUSY_TIMEOUT_MS = 30_000
DELETE_CHUNK = 5_000

_TEXT = {"event_id", "key_id", "team", "model", "provider", "task", "route", "usage_source"}
_TEXT |= {"policy_version", "end_user", "tags", "price_catalogue"}
_EVENT_TYPES = tuple("TEXT" if name in _TEXT else "INTEGER" for name in EVENT_COLUMNS)

# Each entry upgrades the schema by one version; never edit one that has shipped.
MIGRATIONS: tuple[str, ...] = (
    usage_schema_sql(_EVENT_TYPES, events_options=" STRICT", options=" STRICT"),
    AUDIT_MIGRATION,  # version 2: the admin audit log (gateway/ledger/audit.py)
    # 3: the store's identity, made once with the store (see UsageStore.store_id).
    """
CREATE TABLE usage_store_identity (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id TEXT NOT NULL
) STRICT;
INSERT INTO usage_store_identity (singleton, store_id) VALUES (1, lower(hex(randomblob(8))));
""",
    DEAD_LETTER_MIGRATION,  # 4: events the store could not keep (gateway/ledger/dead_letters.py)
    # 5: the price catalogue an event was costed from ("" for the policy's own price).
    "ALTER TABLE usage_events ADD COLUMN price_catalogue TEXT NOT NULL DEFAULT '';",
    BATCH_MIGRATION,  # 6: batch files, batches and their lines (gateway/ledger/batch_tables.py)
    NATIVE_BATCH_MIGRATION,  # 7: lines sent to a provider's own batch API (batch_tables.py)
)
SCHEMA_VERSION = len(MIGRATIONS)
CREATE_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS usage_schema_version"
    " (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT"
)
SELECT_STORE_ID = "SELECT store_id FROM usage_store_identity"
INSERT_EVENT = (
    f"INSERT INTO usage_events ({', '.join(EVENT_COLUMNS)})"
    f" VALUES ({', '.join('?' for _ in EVENT_COLUMNS)}) ON CONFLICT DO NOTHING"
)
_ADD = ", ".join(f"{name} = {name} + excluded.{name}" for name in COUNTERS)


def _upsert(table: str, keys: str) -> str:
    width = len(keys.split(",")) + len(COUNTERS)
    return (
        f"INSERT INTO {table} ({keys}, {', '.join(COUNTERS)})"
        f" VALUES ({', '.join('?' for _ in range(width))})"
        f" ON CONFLICT ({keys}) DO UPDATE SET {_ADD}"
    )


_MAIN_KEYS = "day, key_id, team, model, provider, task"
UPSERT_MAIN = _upsert("usage_rollup", _MAIN_KEYS)
UPSERT_TAG = _upsert("usage_rollup_tag", "day, tag, key_id, team, model, provider, task")
UPSERT_USER = _upsert("usage_rollup_user", "day, end_user, key_id, team, model, provider, task")


def _statements(script: str) -> list[str]:
    """A migration's statements, split where SQLite says one is complete (a trigger's body
    holds semicolons of its own)."""
    statements, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending)
            pending = ""
    if pending.strip():
        statements.append(pending)
    return statements


def day_value(day: date) -> int:
    return (day - EPOCH_DAY).days


def day_text(value: int) -> str:
    return (EPOCH_DAY + timedelta(days=value)).isoformat()


def _placeholder(_: int) -> str:
    return "?"


def _event_params(event: UsageEvent) -> tuple[Any, ...]:
    return row_values(
        event,
        day=event.day_number,
        streamed=int(event.streamed),
        tags=orjson.dumps(event.tags).decode(),
    )


def _event_of(row: Sequence[Any]) -> UsageEvent:
    values = list(row)
    values[14] = bool(values[14])  # streamed
    values[21] = tuple(orjson.loads(values[21]))  # tags
    return UsageEvent(*values)


def _add(
    cells: dict[tuple[Any, ...], list[int]], key: tuple[Any, ...], counts: tuple[int, ...]
) -> None:
    cell = cells.get(key)
    if cell is None:
        cells[key] = list(counts)
    else:
        for index, value in enumerate(counts):
            cell[index] += value


def until_unlocked(step: Callable[[], T]) -> T:
    """``step``, tried again while SQLite answers "database is locked" (up to the busy timeout).
    SQLite gives that answer at once, without its busy handler, in a few cases such as the
    switch to WAL while other processes open the same new file (replicas starting together
    on one DATA_DIR)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


class _Worker:
    """One thread owning one sqlite3 connection; ``run`` hands it a function of the connection."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise RuntimeError("the usage store is not open")
        return fn(self._conn)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn)

    async def connect(self, opener: Callable[[], sqlite3.Connection]) -> None:
        def attach() -> None:
            self._conn = opener()

        await asyncio.get_running_loop().run_in_executor(self._executor, attach)

    async def close(self) -> None:
        """Close the connection and end the thread; closing twice is harmless."""
        if self._closed:
            return
        self._closed = True

        def detach() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, detach)
        self._executor.shutdown(wait=True)


def _create_private(path: Path) -> None:
    """The store's folder (when made here: 0700) and file (0600) before SQLite opens it: SQLite
    gives its -wal and -shm files the database file's mode, so usage stays private."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))


class SqliteStore(SqlStore):
    """``UsageStore`` in one SQLite file."""

    kind = "sqlite"
    dialect = SqlDialect(_placeholder, day_value, day_text, _event_of)
    # A constraint or a value SQLite cannot hold (an integer past 64 bits: OverflowError).
    refusals = (sqlite3.IntegrityError, sqlite3.DataError, OverflowError)

    def __init__(
        self, path: Path, *, synchronous: str = "FULL", **options: Unpack[StoreOptions]
    ) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise StoreConfigError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        super().__init__(**options)
        self.path = Path(path)
        self.synchronous = synchronous
        self._writer = _Worker("usage-sqlite-writer")
        self._reader = _Worker("usage-sqlite-reader")

    def _connect(self, *, read_only: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if read_only:
            conn.execute("PRAGMA query_only = ON")
        else:
            until_unlocked(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        return conn

    async def open(self) -> None:
        try:
            _create_private(self.path)
            await self._writer.connect(functools.partial(self._connect, read_only=False))
            await self._writer.run(lambda conn: until_unlocked(lambda: self._migrate(conn)))
            await self._reader.connect(functools.partial(self._connect, read_only=True))
            self.store_id = await self._reader.run(
                lambda conn: conn.execute(SELECT_STORE_ID).fetchone()[0]
            )
        except (OSError, sqlite3.Error) as exc:
            await self.close()
            raise StoreConfigError(f"cannot open the usage store {self.path}: {exc}") from None
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._reader.close()
        await self._writer.close()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")  # one process migrates; others wait, then skip
        try:
            conn.execute(CREATE_VERSION_TABLE)
            current = conn.execute(
                "SELECT coalesce(max(version), 0) FROM usage_schema_version"
            ).fetchone()[0]
            for version in versions_to_apply(current, SCHEMA_VERSION):
                for statement in _statements(MIGRATIONS[version - 1]):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO usage_schema_version (version, applied_at) VALUES (?, ?)",
                    (version, int(time.time())),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def schema_version(self) -> int:
        row = await self._reader.run(
            lambda conn: conn.execute("SELECT max(version) FROM usage_schema_version").fetchone()
        )
        return int(row[0])

    # -- writes --------------------------------------------------------------------------

    async def _write(self, events: list[UsageEvent]) -> int:
        events.sort(key=lambda event: (event.time_ms // 86_400_000, event.event_id))
        return await self._writer.run(functools.partial(self._insert, events))

    @staticmethod
    def _insert(events: list[UsageEvent], conn: sqlite3.Connection) -> int:
        main: dict[tuple[Any, ...], list[int]] = {}
        tags: dict[tuple[Any, ...], list[int]] = {}
        users: dict[tuple[Any, ...], list[int]] = {}
        inserted = 0
        conn.execute("BEGIN IMMEDIATE")
        try:
            clock = time.perf_counter
            yield_at = clock() + YIELD_EVERY_S
            for event in events:
                if clock() >= yield_at:
                    _yield_cpu()
                    yield_at = clock() + YIELD_EVERY_S
                if conn.execute(INSERT_EVENT, _event_params(event)).rowcount != 1:
                    continue  # already stored: counts nothing
                inserted += 1
                dims = (event.key_id, event.team, event.model, event.provider, event.task)
                day = event.day_number
                counts = event_counts(event)
                _add(main, (day, *dims), counts)
                for tag in event.tags or ("",):  # untagged counts under the empty tag
                    _add(tags, (day, tag, *dims), counts)
                _add(users, (day, event.end_user, *dims), counts)
            for sql, cells in ((UPSERT_MAIN, main), (UPSERT_TAG, tags), (UPSERT_USER, users)):
                conn.executemany(sql, [(*key, *cell) for key, cell in sorted(cells.items())])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return inserted

    # -- reads ---------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: list[Any]) -> list[Any]:
        return await self._reader.run(lambda conn: conn.execute(sql, params).fetchall())

    async def _write_rows(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        def write(conn: sqlite3.Connection) -> int:
            changed = 0
            conn.execute("BEGIN IMMEDIATE")
            try:
                for row in rows:
                    changed += conn.execute(sql, row).rowcount
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return changed

        return await self._writer.run(write)

    # -- retention -----------------------------------------------------------------------

    async def maintain(self) -> RetentionResult:
        return await self.apply_retention()

    async def apply_retention(self, today: date | None = None) -> RetentionResult:
        return await self._writer.run(functools.partial(self._expire, self.cutoff(today)))

    @staticmethod
    def _expire(cutoff: date, conn: sqlite3.Connection) -> RetentionResult:
        limit = day_value(cutoff)
        days = [
            row[0]
            for row in conn.execute("SELECT DISTINCT day FROM usage_events WHERE day < ?", (limit,))
        ]
        events_deleted = 0
        while True:  # short transactions: a writer waits at most one chunk
            deleted = conn.execute(
                "DELETE FROM usage_events WHERE rowid IN"
                " (SELECT rowid FROM usage_events WHERE day < ? LIMIT ?)",
                (limit, DELETE_CHUNK),
            ).rowcount
            events_deleted += deleted
            if deleted < DELETE_CHUNK:
                break
        rollup_rows = 0
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in ROLLUP_TABLES.values():
                rollup_rows += conn.execute(f"DELETE FROM {table} WHERE day < ?", (limit,)).rowcount
            # Dead letters are kept as long as usage is, then go with their day.
            conn.execute("DELETE FROM usage_dead_letters WHERE day < ?", (limit,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if events_deleted or rollup_rows:
            log.info(
                "usage_retention",
                cutoff=cutoff.isoformat(),
                events=events_deleted,
                rollup_rows=rollup_rows,
            )
        return RetentionResult(
            cutoff,
            tuple(EPOCH_DAY + timedelta(days=day) for day in days),
            events_deleted,
            rollup_rows,
        )
