"""The usage store on a shared PostgreSQL server, through an asyncpg connection pool.

asyncpg and COPY were chosen by measurement over psycopg 3 and over unnest, executemany or
multi-row VALUES (``python -m bench.ledger``; figures in docs/usage.md). A batch is one
transaction: binary COPY into the connection's temp staging table (created when the pool opens
the connection, emptied at every commit), then one ``INSERT ... SELECT ... ON CONFLICT DO
NOTHING RETURNING`` statement that also updates the rollups (``postgres_sql.INSERT_FROM_STAGE``).
The staging table lives in the session, so the store needs a direct connection or session
pooling (asyncpg's prepared statements need that too), not a transaction-pooling proxy.

Day partitions of ``usage_events`` are created ahead (today plus ``PARTITIONS_AHEAD``) and on
demand for any other day a batch holds, under an advisory lock so replicas never race on DDL.
A replica's cache of existing partitions may go stale when another replica drops one; the
insert then fails with "no partition", the cache is reloaded and the batch retried. Retention
drops whole partitions (a brief ACCESS EXCLUSIVE lock on the parent, bounded by
``lock_timeout``) and deletes rollup rows of the dropped days.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import date, timedelta
from typing import Any, Unpack

import asyncpg
import structlog

from gateway.ledger.event import UsageEvent
from gateway.ledger.postgres_sql import (
    CREATE_STAGE,
    CREATE_VERSION_TABLE,
    INSERT_FROM_STAGE,
    LIST_PARTITIONS,
    MIGRATIONS,
    PARTITION_LOCK,
    PARTITIONS_AHEAD,
    SCHEMA_LOCK,
    SCHEMA_VERSION,
    SELECT_STORE_ID,
    STAGE_TABLE,
    create_partition_sql,
    drop_partition_sql,
    event_row,
    partition_day,
)
from gateway.ledger.store import (
    RetentionResult,
    SqlDialect,
    SqlStore,
    StoreConfigError,
    StoreOptions,
    redact,
    versions_to_apply,
)
from gateway.ledger.tables import EVENT_COLUMNS, ROLLUP_TABLES

log = structlog.get_logger(__name__)

# Deadlocks cannot happen between our own writers (sorted inserts, sorted upserts), but a
# retry keeps a batch alive against anything else holding rows in another order.
RETRIES = 3
DDL_LOCK_TIMEOUT = "5s"


def _placeholder(index: int) -> str:
    return f"${index}"


def _same_day(day: date) -> date:
    return day


def _iso(day: date) -> str:
    return day.isoformat()


def _event_of(record: Sequence[Any]) -> UsageEvent:
    return UsageEvent(*record)


async def _create_stage(conn: asyncpg.Connection) -> None:
    """Every pooled connection gets its own staging table for COPY (temp: per session)."""
    await conn.execute(CREATE_STAGE)


class PostgresStore(SqlStore):
    """``UsageStore`` on PostgreSQL. One pool per process; safe to share between tasks."""

    kind = "postgresql"
    dialect = SqlDialect(_placeholder, _same_day, _iso, _event_of)
    # Classes 22 (data exception: a value out of range, a character the encoding lacks) and
    # 23 (integrity: a constraint or a trigger's check) refuse the data; the rest may pass.
    refusals = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)

    def __init__(self, url: str, *, pool_size: int = 4, **options: Unpack[StoreOptions]) -> None:
        super().__init__(**options)
        self.url = url
        self.pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._partitions: set[date] = set()
        self._partition_lock = asyncio.Lock()

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("the usage store is not open")
        return self._pool

    async def open(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=1,
                max_size=self.pool_size,
                command_timeout=60,
                init=_create_stage,
            )
        except (OSError, asyncpg.PostgresError, ValueError) as exc:
            raise StoreConfigError(
                f"cannot connect to the usage store {redact(self.url)}: {type(exc).__name__}: "
                f"{str(exc).replace(self.url, redact(self.url))}"
            ) from None
        try:
            async with self.pool.acquire() as conn:
                await self._migrate(conn)
                self.store_id = await conn.fetchval(SELECT_STORE_ID)
            await self._load_partitions()
            today = self.today()
            await self._ensure_partitions(
                today + timedelta(days=n) for n in range(PARTITIONS_AHEAD + 1)
            )
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _migrate(self, conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            # One replica migrates at a time; the others wait, then find nothing to do.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
            await conn.execute(CREATE_VERSION_TABLE)
            current = await conn.fetchval(
                "SELECT coalesce(max(version), 0) FROM usage_schema_version"
            )
            for version in versions_to_apply(current, SCHEMA_VERSION):
                await conn.execute(MIGRATIONS[version - 1])
                await conn.execute(
                    "INSERT INTO usage_schema_version (version) VALUES ($1)", version
                )
                log.info("usage_store_migrated", backend=self.kind, version=version)

    async def schema_version(self) -> int:
        return await self.pool.fetchval("SELECT max(version) FROM usage_schema_version")

    # -- partitions ----------------------------------------------------------------------

    async def _load_partitions(self) -> None:
        names = await self.pool.fetch(LIST_PARTITIONS)
        self._partitions = {day for (name,) in names if (day := partition_day(name)) is not None}

    async def partitions(self) -> list[date]:
        """Days that have a partition now (read from the catalog, not the cache)."""
        await self._load_partitions()
        return sorted(self._partitions)

    async def _ensure_partitions(self, days: Iterable[date]) -> None:
        missing = sorted(set(days) - self._partitions)
        if not missing:
            return
        async with self._partition_lock, self.pool.acquire() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
            await conn.execute("SELECT pg_advisory_xact_lock($1)", PARTITION_LOCK)
            for day in missing:
                await conn.execute(create_partition_sql(day))
        self._partitions.update(missing)

    # -- writes --------------------------------------------------------------------------

    async def _write(self, events: list[UsageEvent]) -> int:
        rows = [event_row(event) for event in events]  # staged rows are read back sorted
        days = {row[0] for row in rows}
        for attempt in range(1, RETRIES + 1):
            await self._ensure_partitions(days)
            try:
                return await self._copy_insert(rows)
            except asyncpg.CheckViolationError:
                # A partition this replica believed in was dropped elsewhere: look again.
                if attempt == RETRIES:
                    raise
                await self._load_partitions()
            except asyncpg.DeadlockDetectedError:
                if attempt == RETRIES:
                    raise
                await asyncio.sleep(0.01 * attempt)
        raise AssertionError("unreachable")

    async def _copy_insert(self, rows: list[tuple[object, ...]]) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.copy_records_to_table(STAGE_TABLE, records=rows, columns=EVENT_COLUMNS)
            return await conn.fetchval(INSERT_FROM_STAGE)

    # -- reads ---------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: list[Any]) -> list[asyncpg.Record]:
        return await self.pool.fetch(sql, *params)

    async def _write_rows(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        changed = 0
        async with self.pool.acquire() as conn, conn.transaction():
            for row in rows:
                status = await conn.execute(sql, *row)
                changed += int(status.rsplit(" ", 1)[-1])
        return changed

    # -- retention -----------------------------------------------------------------------

    async def maintain(self) -> RetentionResult:
        today = self.today()
        await self._ensure_partitions(
            today + timedelta(days=n) for n in range(PARTITIONS_AHEAD + 1)
        )
        return await self.apply_retention(today)

    async def apply_retention(self, today: date | None = None) -> RetentionResult:
        cutoff = self.cutoff(today)
        await self._load_partitions()
        expired = sorted(day for day in self._partitions if day < cutoff)
        async with self._partition_lock, self.pool.acquire() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
            await conn.execute("SELECT pg_advisory_xact_lock($1)", PARTITION_LOCK)
            for day in expired:
                await conn.execute(drop_partition_sql(day))
            deleted = 0
            for table in ROLLUP_TABLES.values():
                status = await conn.execute(f"DELETE FROM {table} WHERE day < $1", cutoff)
                deleted += int(status.rsplit(" ", 1)[-1])
            # Dead letters are kept as long as usage is, then go with their day.
            await conn.execute("DELETE FROM usage_dead_letters WHERE day < $1", cutoff)
        self._partitions.difference_update(expired)
        if expired or deleted:
            log.info(
                "usage_retention",
                cutoff=cutoff.isoformat(),
                partitions=len(expired),
                rollup_rows=deleted,
            )
        return RetentionResult(cutoff, tuple(expired), None, deleted)
