"""One transaction of SQL steps, on SQLite or PostgreSQL: what the batch store runs.

A ``Step`` is a statement, its parameters and what it hands back: ``rows`` (the rows it
selected or returned), ``count`` (the rows it changed) or ``many`` (the statement run once per
parameter tuple, nothing back). Statements number their parameters (``?1`` in SQLite, ``$1``
in PostgreSQL: ``mark(n)``), so one text serves both and a parameter may be used twice.

``SqliteSql`` owns two connections to the usage store's file, each on its own thread (a writer,
whose transactions are ``BEGIN IMMEDIATE`` with a busy timeout so replicas may share the file,
and a reader: WAL lets reads go on beside a write); ``PostgresSql`` a small asyncpg pool. Both
open a store whose schema the usage store has already migrated.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import asyncpg

from gateway.ledger.sqlite_store import BUSY_TIMEOUT_MS, until_unlocked

T = TypeVar("T")
Mode = Literal["rows", "count", "many"]


@dataclass(frozen=True, slots=True)
class Step:
    sql: str
    params: Sequence[Any] = ()
    mode: Mode = "count"


class SqlRunner(Protocol):
    kind: str

    def mark(self, index: int) -> str:
        """The ``index``-th (1-based) parameter in this backend's SQL."""
        ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, steps: Sequence[Step]) -> list[Any]:
        """Every step in one transaction; what each handed back, in order."""
        ...

    async def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read (no transaction of its own beyond the statement's)."""
        ...


class _Thread:
    """One thread owning one sqlite3 connection."""

    def __init__(self, name: str, connect: Callable[[], sqlite3.Connection]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._connect = connect
        self._conn: sqlite3.Connection | None = None

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = self._connect()
        return work(self._conn)

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, work)

    async def close(self) -> None:
        def detach() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, detach)
        self._executor.shutdown(wait=True)


class SqliteSql:
    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = _Thread("batch-sqlite-writer", self._connect)
        self._reader = _Thread("batch-sqlite-reader", self._connect)

    def mark(self, index: int) -> str:
        return f"?{index}"

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # An answered line or an accepted upload must survive power loss, as usage does.
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    async def open(self) -> None:
        await self._reader.run(lambda conn: conn.execute("SELECT 1 FROM batches LIMIT 1"))

    async def close(self) -> None:
        await self._reader.close()
        await self._writer.close()

    async def run(self, steps: Sequence[Step]) -> list[Any]:
        def work(conn: sqlite3.Connection) -> list[Any]:
            until_unlocked(lambda: conn.execute("BEGIN IMMEDIATE"))
            try:
                results = [_sqlite_step(conn, step) for step in steps]
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return results

        return await self._writer.run(work)

    async def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._reader.run(lambda conn: conn.execute(sql, tuple(params)).fetchall())


def _sqlite_step(conn: sqlite3.Connection, step: Step) -> Any:
    if step.mode == "many":
        conn.executemany(step.sql, step.params)
        return None
    cursor = conn.execute(step.sql, tuple(step.params))
    if step.mode == "rows":
        return cursor.fetchall()
    return cursor.rowcount


class PostgresSql:
    kind = "postgresql"

    def __init__(self, url: str, pool_size: int = 4) -> None:
        self.url = url
        self.pool_size = pool_size
        self._pool: asyncpg.Pool | None = None

    def mark(self, index: int) -> str:
        return f"${index}"

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("the batch store is not open")
        return self._pool

    async def open(self) -> None:
        self._pool = await asyncpg.create_pool(
            self.url, min_size=1, max_size=self.pool_size, command_timeout=60
        )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def run(self, steps: Sequence[Step]) -> list[Any]:
        results: list[Any] = []
        async with self.pool.acquire() as conn, conn.transaction():
            for step in steps:
                if step.mode == "many":
                    await conn.executemany(step.sql, step.params)
                    results.append(None)
                elif step.mode == "rows":
                    results.append([tuple(row) for row in await conn.fetch(step.sql, *step.params)])
                else:
                    status = await conn.execute(step.sql, *step.params)
                    results.append(int(status.rsplit(" ", 1)[-1]))
        return results

    async def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self.pool.fetch(sql, *params)]
