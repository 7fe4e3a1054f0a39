"""``BatchStore``: files, batches and lines in the SQL store (``gateway/ledger/batch_tables.py``).

Every replica that shares the store shares the work: a line is claimed under a lease
(``claim_lines``), renewed while it runs (``renew``), and answered once (``answer``: the update
only applies to a line still open, so of two replicas that ran the same line, after one of them
died or stalled past its lease, the first answer stands). A batch is closed by one replica at a
time (``begin_close``, a lease on the batch row); the files it writes have ids derived from the
batch, so a close redone after a crash writes the same files.

``make_batch_store(url, data_dir=...)`` picks the backend from the usage store's URL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.batches.native.store import NativeStore
from gateway.batches.records import (
    UNANSWERED,
    BatchRecord,
    ClaimedLine,
    FileRecord,
    LineAnswer,
    LineCounts,
    NewLine,
    StoredLine,
)
from gateway.batches.sql import PostgresSql, SqliteSql, SqlRunner, Step
from gateway.ledger.store import SQLITE_FILE, check_store_url

CHUNK_BYTES = 1024 * 1024
_FILE_COLUMNS = tuple(field.name for field in dataclasses.fields(FileRecord))
_BATCH_COLUMNS = tuple(field.name for field in dataclasses.fields(BatchRecord))
_OPEN = "(" + ", ".join(f"'{state}'" for state in UNANSWERED) + ")"


def make_batch_store(url: str, *, data_dir: Path) -> BatchStore:
    """The batch store beside the usage store ``url`` names (empty: DATA_DIR's SQLite file)."""
    url = check_store_url(url)
    if url.startswith(("postgresql:", "postgres:")):
        return BatchStore(PostgresSql(url))
    path = Path(url.removeprefix("sqlite:///")) if url else data_dir / SQLITE_FILE
    return BatchStore(SqliteSql(path))


def _marks(sql: SqlRunner, count: int, first: int = 1) -> str:
    return ", ".join(sql.mark(first + n) for n in range(count))


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing, newest first; ``has_more`` says another follows."""

    items: list[Any]
    has_more: bool


class BatchStore:
    def __init__(self, sql: SqlRunner) -> None:
        self.sql = sql
        # The lines sent to providers' own batch APIs, in the same store.
        self.native = NativeStore(sql)

    @property
    def kind(self) -> str:
        return self.sql.kind

    async def open(self) -> None:
        await self.sql.open()

    async def close(self) -> None:
        await self.sql.close()

    # -- files ---------------------------------------------------------------------------

    def _file_steps(self, record: FileRecord, data: bytes) -> list[Step]:
        m = self.sql.mark
        insert = (
            f"INSERT INTO batch_files ({', '.join(_FILE_COLUMNS)})"
            f" VALUES ({_marks(self.sql, len(_FILE_COLUMNS))}) ON CONFLICT DO NOTHING"
        )
        chunks = [
            (record.file_id, seq, data[start : start + CHUNK_BYTES])
            for seq, start in enumerate(range(0, len(data), CHUNK_BYTES))
        ]
        steps = [Step(insert, dataclasses.astuple(record))]
        if chunks:
            steps.append(
                Step(
                    "INSERT INTO batch_file_chunks (file_id, seq, data)"
                    f" VALUES ({m(1)}, {m(2)}, {m(3)}) ON CONFLICT DO NOTHING",
                    chunks,
                    "many",
                )
            )
        return steps

    async def add_file(self, record: FileRecord, data: bytes) -> None:
        await self.sql.run(self._file_steps(record, data))

    async def file(self, file_id: str) -> FileRecord | None:
        m = self.sql.mark
        rows = await self.sql.rows(
            f"SELECT {', '.join(_FILE_COLUMNS)} FROM batch_files WHERE file_id = {m(1)}",
            [file_id],
        )
        return FileRecord(*rows[0]) if rows else None

    async def file_bytes(self, file_id: str) -> bytes:
        m = self.sql.mark
        rows = await self.sql.rows(
            f"SELECT data FROM batch_file_chunks WHERE file_id = {m(1)} ORDER BY seq", [file_id]
        )
        return b"".join(bytes(row[0]) for row in rows)

    async def files(
        self, key_id: str | None, *, purpose: str | None, after: FileRecord | None, limit: int
    ) -> Page:
        """Files newest first (of one key, or all when ``key_id`` is None), after ``after``."""
        where, params = self._page_filter(key_id, after, "file_id")
        if purpose is not None:
            params.append(purpose)
            where.append(f"purpose = {self.sql.mark(len(params))}")
        params.append(limit + 1)
        sql = (
            f"SELECT {', '.join(_FILE_COLUMNS)} FROM batch_files"
            f"{' WHERE ' + ' AND '.join(where) if where else ''}"
            f" ORDER BY created_ms DESC, file_id DESC LIMIT {self.sql.mark(len(params))}"
        )
        rows = await self.sql.rows(sql, params)
        return Page([FileRecord(*row) for row in rows[:limit]], len(rows) > limit)

    async def delete_file(self, file_id: str) -> bool:
        m = self.sql.mark
        deleted, _ = await self.sql.run(
            [
                Step(f"DELETE FROM batch_files WHERE file_id = {m(1)}", [file_id]),
                Step(f"DELETE FROM batch_file_chunks WHERE file_id = {m(1)}", [file_id]),
            ]
        )
        return bool(deleted)

    def _page_filter(
        self, key_id: str | None, after: Any, id_column: str
    ) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        m = self.sql.mark
        if key_id is not None:
            params.append(key_id)
            where.append(f"key_id = {m(len(params))}")
        if after is not None:
            params += [after.created_ms, getattr(after, id_column)]
            first, second = m(len(params) - 1), m(len(params))
            where.append(
                f"(created_ms < {first} OR (created_ms = {first} AND {id_column} < {second}))"
            )
        return where, params

    # -- batches -------------------------------------------------------------------------

    async def add_batch(self, record: BatchRecord) -> None:
        sql = (
            f"INSERT INTO batches ({', '.join(_BATCH_COLUMNS)})"
            f" VALUES ({_marks(self.sql, len(_BATCH_COLUMNS))})"
        )
        await self.sql.run([Step(sql, dataclasses.astuple(record))])

    async def add_batch_with_lines(self, record: BatchRecord, lines: Sequence[NewLine]) -> None:
        """A batch whose requests came inline (Anthropic's): made and started at once."""
        sql = (
            f"INSERT INTO batches ({', '.join(_BATCH_COLUMNS)})"
            f" VALUES ({_marks(self.sql, len(_BATCH_COLUMNS))})"
        )
        await self.sql.run(
            [Step(sql, dataclasses.astuple(record)), self._lines_step(lines, record.batch_id)]
        )

    async def batch(self, batch_id: str) -> BatchRecord | None:
        rows = await self.sql.rows(
            f"SELECT {', '.join(_BATCH_COLUMNS)} FROM batches WHERE batch_id = {self.sql.mark(1)}",
            [batch_id],
        )
        return BatchRecord(*rows[0]) if rows else None

    async def batches(
        self,
        key_id: str | None,
        *,
        api: str | None,
        after: BatchRecord | None,
        limit: int,
        newer_than: BatchRecord | None = None,
    ) -> Page:
        """Batches newest first (of one key, or all), after ``after`` (older) or, with
        ``newer_than``, the page just before it."""
        where, params = self._page_filter(key_id, after, "batch_id")
        m = self.sql.mark
        if api is not None:
            params.append(api)
            where.append(f"api = {m(len(params))}")
        order = "DESC"
        if newer_than is not None:
            params += [newer_than.created_ms, newer_than.batch_id]
            first, second = m(len(params) - 1), m(len(params))
            where.append(
                f"(created_ms > {first} OR (created_ms = {first} AND batch_id > {second}))"
            )
            order = "ASC"
        params.append(limit + 1)
        sql = (
            f"SELECT {', '.join(_BATCH_COLUMNS)} FROM batches"
            f"{' WHERE ' + ' AND '.join(where) if where else ''}"
            f" ORDER BY created_ms {order}, batch_id {order} LIMIT {m(len(params))}"
        )
        rows = [BatchRecord(*row) for row in await self.sql.rows(sql, params)]
        page = rows[:limit]
        if newer_than is not None:
            page.reverse()
        return Page(page, len(rows) > limit)

    async def open_batches(self) -> list[BatchRecord]:
        """Batches a runner still has work in, oldest first."""
        rows = await self.sql.rows(
            f"SELECT {', '.join(_BATCH_COLUMNS)} FROM batches"
            " WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling')"
            " ORDER BY created_ms, batch_id"
        )
        return [BatchRecord(*row) for row in rows]

    def _lines_step(self, lines: Sequence[NewLine], batch_id: str) -> Step:
        return Step(
            "INSERT INTO batch_lines (batch_id, line_index, custom_id, body, state, tries)"
            f" VALUES ({_marks(self.sql, 4)}, 'pending', 0) ON CONFLICT DO NOTHING",
            [(batch_id, line.index, line.custom_id, line.body) for line in lines],
            "many",
        )

    async def start(self, batch_id: str, lines: Sequence[NewLine], now_ms: int) -> bool:
        """Its lines stored and the batch ``in_progress`` (if still ``validating``); a start
        that two replicas both make stores the lines once."""
        m = self.sql.mark
        steps = [self._lines_step(lines, batch_id)] if lines else []
        steps.append(
            Step(
                f"UPDATE batches SET status = 'in_progress', in_progress_ms = {m(1)},"
                f" total = {m(2)} WHERE batch_id = {m(3)} AND status = 'validating'",
                [now_ms, len(lines), batch_id],
            )
        )
        return bool((await self.sql.run(steps))[-1])

    async def fail(self, batch_id: str, errors_json: str, now_ms: int) -> bool:
        """A refused input: ``failed`` with the errors (if still ``validating``)."""
        m = self.sql.mark
        (changed,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batches SET status = 'failed', failed_ms = {m(1)},"
                    f" errors_json = {m(2)} WHERE batch_id = {m(3)} AND status = 'validating'",
                    [now_ms, errors_json, batch_id],
                )
            ]
        )
        return bool(changed)

    async def cancel(self, batch_id: str, now_ms: int) -> bool:
        """``cancelling`` (from ``validating`` or ``in_progress``); False if it was not."""
        m = self.sql.mark
        (changed,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batches SET status = 'cancelling', cancelling_ms = {m(1)}"
                    f" WHERE batch_id = {m(2)} AND status IN ('validating', 'in_progress')",
                    [now_ms, batch_id],
                )
            ]
        )
        return bool(changed)

    async def expire_at(self, batch_id: str, expires_ms: int) -> None:
        """Move a batch's deadline (operators and tests: a window that ends now)."""
        m = self.sql.mark
        await self.sql.run(
            [
                Step(
                    f"UPDATE batches SET expires_ms = {m(1)} WHERE batch_id = {m(2)}",
                    [expires_ms, batch_id],
                )
            ]
        )

    async def delete_batch(self, batch_id: str) -> None:
        """A final batch, its lines and its upstream batches' records (Anthropic's delete); its
        files stay files."""
        m = self.sql.mark
        await self.sql.run(
            [
                Step(f"DELETE FROM batch_lines WHERE batch_id = {m(1)}", [batch_id]),
                Step(f"DELETE FROM batch_natives WHERE batch_id = {m(1)}", [batch_id]),
                Step(f"DELETE FROM batches WHERE batch_id = {m(1)}", [batch_id]),
            ]
        )

    # -- lines ---------------------------------------------------------------------------

    async def claim_lines(
        self, batch_id: str, owner: str, *, now_ms: int, lease_ms: int, limit: int
    ) -> list[ClaimedLine]:
        """Up to ``limit`` open lines of an ``in_progress`` batch whose window is still open
        and whose lines are routed (``NativeStore.route``), leased to ``owner``: pending ones,
        or those whose holder let its lease lapse."""
        m = self.sql.mark
        skip = " FOR UPDATE SKIP LOCKED" if self.sql.kind == "postgresql" else ""
        # The pick is a CTE: PostgreSQL runs it once (a subquery under IN may be run again
        # per row, and then take more than ``limit``).
        sql = (
            f"WITH picked AS (SELECT line_index FROM batch_lines WHERE batch_id = {m(3)}"
            f" AND (state = 'pending' OR (state = 'leased' AND lease_until_ms < {m(4)}))"
            f" AND EXISTS (SELECT 1 FROM batches WHERE batch_id = {m(3)}"
            f" AND status = 'in_progress' AND expires_ms > {m(4)} AND routed_ms IS NOT NULL)"
            f" ORDER BY line_index LIMIT {m(5)}{skip})"
            f" UPDATE batch_lines SET state = 'leased', owner = {m(1)}, lease_until_ms = {m(2)},"
            f" tries = tries + 1 WHERE batch_id = {m(3)}"
            " AND line_index IN (SELECT line_index FROM picked)"
            " RETURNING line_index, custom_id, body, tries"
        )
        (rows,) = await self.sql.run(
            [Step(sql, [owner, now_ms + lease_ms, batch_id, now_ms, limit], "rows")]
        )
        claimed = [ClaimedLine(batch_id, int(r[0]), r[1], r[2], int(r[3])) for r in rows]
        return sorted(claimed, key=lambda line: line.index)

    async def renew(self, owner: str, until_ms: int) -> int:
        """Extend every lease ``owner`` holds (lines, and upstream batches it works on); how
        many it holds."""
        m = self.sql.mark
        renewed = await self.sql.run(
            [
                Step(
                    f"UPDATE batch_lines SET lease_until_ms = {m(1)}"
                    f" WHERE owner = {m(2)} AND state = 'leased'",
                    [until_ms, owner],
                ),
                self.native.renew_step(owner, until_ms),
            ]
        )
        return sum(int(count) for count in renewed)

    async def release(self, batch_id: str, index: int, owner: str) -> bool:
        """Give a line back unanswered (to be tried again later)."""
        m = self.sql.mark
        (changed,) = await self.sql.run(
            [
                Step(
                    "UPDATE batch_lines SET state = 'pending', owner = NULL, lease_until_ms = NULL"
                    f" WHERE batch_id = {m(1)} AND line_index = {m(2)} AND owner = {m(3)}"
                    " AND state = 'leased'",
                    [batch_id, index, owner],
                )
            ]
        )
        return bool(changed)

    async def answer(
        self, batch_id: str, index: int, answer: LineAnswer, request_id: str, now_ms: int
    ) -> bool:
        """Record a line's answer if it has none yet; False: it was answered (or closed)
        already, and this answer is dropped."""
        m = self.sql.mark
        (changed,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batch_lines SET state = 'done', status_code = {m(1)},"
                    f" response = {m(2)}, request_id = {m(3)}, done_ms = {m(4)}, owner = NULL,"
                    f" lease_until_ms = NULL WHERE batch_id = {m(5)} AND line_index = {m(6)}"
                    f" AND state IN {_OPEN}",
                    [answer.status_code, answer.response, request_id, now_ms, batch_id, index],
                )
            ]
        )
        return bool(changed)

    async def counts(self, batch_id: str) -> LineCounts:
        m = self.sql.mark
        rows = await self.sql.rows(
            "SELECT state, CASE WHEN status_code BETWEEN 200 AND 299 THEN 1 ELSE 0 END,"
            f" count(*) FROM batch_lines WHERE batch_id = {m(1)} GROUP BY 1, 2",
            [batch_id],
        )
        found: dict[str, int] = {}
        total = 0
        for state, ok, count in rows:
            total += int(count)
            name = ("completed" if ok else "failed") if state == "done" else state
            found[name] = found.get(name, 0) + int(count)
        return LineCounts(
            total=total,
            completed=found.get("completed", 0),
            failed=found.get("failed", 0),
            cancelled=found.get("cancelled", 0),
            expired=found.get("expired", 0),
        )

    async def running_lines(self, batch_id: str, now_ms: int) -> int:
        """Lines some replica holds under a lease that has not lapsed."""
        m = self.sql.mark
        rows = await self.sql.rows(
            f"SELECT count(*) FROM batch_lines WHERE batch_id = {m(1)} AND state = 'leased'"
            f" AND lease_until_ms >= {m(2)}",
            [batch_id, now_ms],
        )
        return int(rows[0][0])

    async def lines(self, batch_id: str, *, after: int = -1, limit: int = 1000) -> list[StoredLine]:
        """A page of a batch's lines in order, after line ``after``."""
        m = self.sql.mark
        rows = await self.sql.rows(
            "SELECT line_index, custom_id, state, status_code, response, request_id"
            f" FROM batch_lines WHERE batch_id = {m(1)} AND line_index > {m(2)}"
            f" ORDER BY line_index LIMIT {m(3)}",
            [batch_id, after, limit],
        )
        return [StoredLine(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in rows]

    # -- closing a batch -----------------------------------------------------------------

    async def begin_close(
        self,
        batch_id: str,
        closer: str,
        *,
        from_status: str,
        to_status: str,
        now_ms: int,
        lease_ms: int,
    ) -> bool:
        """Take the close of a batch (``from_status`` → ``to_status``, stamping
        ``finalizing_ms`` on the way to ``finalizing``) unless another replica holds it."""
        m = self.sql.mark
        stamp = f", finalizing_ms = COALESCE(finalizing_ms, {m(4)})"
        if to_status != "finalizing":
            stamp = ""
        (changed,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batches SET status = {m(1)}, closer = {m(2)}, closer_until_ms = {m(3)}"
                    f"{stamp} WHERE batch_id = {m(5)} AND status = {m(6)}"
                    f" AND (closer IS NULL OR closer = {m(2)} OR closer_until_ms < {m(4)})",
                    [to_status, closer, now_ms + lease_ms, now_ms, batch_id, from_status],
                )
            ]
        )
        return bool(changed)

    async def close_lines(self, batch_id: str, state: str) -> int:
        """Close the lines still open as ``cancelled`` or ``expired`` (native ones too: the
        runner closes a batch once its upstream batches have ended)."""
        m = self.sql.mark
        (closed,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batch_lines SET state = {m(1)}, owner = NULL, lease_until_ms = NULL"
                    f" WHERE batch_id = {m(2)} AND state IN {_OPEN}",
                    [state, batch_id],
                )
            ]
        )
        return int(closed)

    async def finish(
        self,
        batch_id: str,
        closer: str,
        *,
        status: str,
        now_ms: int,
        counts: LineCounts,
        files: Sequence[tuple[FileRecord, bytes]],
        output_file_id: str | None,
        error_file_id: str | None,
    ) -> bool:
        """The batch's files stored and its final ``status``, in one transaction; False when
        another replica took the close over meanwhile (its files are these same files)."""
        m = self.sql.mark
        steps = [step for record, data in files for step in self._file_steps(record, data)]
        stamp = f"{status}_ms"
        steps.append(
            Step(
                f"UPDATE batches SET status = {m(1)}, {stamp} = {m(2)}, output_file_id = {m(3)},"
                f" error_file_id = {m(4)}, total = {m(5)}, completed = {m(6)}, failed = {m(7)},"
                f" closer = NULL, closer_until_ms = NULL WHERE batch_id = {m(8)}"
                f" AND closer = {m(9)}",
                [
                    status,
                    now_ms,
                    output_file_id,
                    error_file_id,
                    counts.total,
                    counts.completed,
                    counts.failed,
                    batch_id,
                    closer,
                ],
            )
        )
        return bool((await self.sql.run(steps))[-1])
