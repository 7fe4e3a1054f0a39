"""The usage store's contract (``UsageStore``) and ``open_store``, which picks the backend.

``SWITCHYARD_USAGE_STORE_URL`` empty means the embedded SQLite file
``DATA_DIR/usage/usage.sqlite3``; ``sqlite:///<relative path>`` or ``sqlite:////<absolute
path>`` names another file; ``postgresql://``
(or ``postgres://``) means a PostgreSQL server shared by every replica. Both backends keep the
same contract, proven by one set of tests: ``insert`` is idempotent by event id and updates the
rollups in the same transaction, only for rows it actually inserted; ``rollup`` reads rollup
tables only; ``list_events`` pages raw events by index; ``maintain`` creates what the coming
days need and applies retention (whole days older than ``retention_days``, today included).
The checks both backends apply alike (a batch against retention, the schema version found
at open) are here too, so they cannot drift apart, and so is ``SqlStore``, the part of the
contract both backends implement alike over their own ``SqlDialect``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypedDict
from urllib.parse import urlsplit

import structlog

from gateway.ledger.dead_letters import (
    DeadLetter,
    DeadLetterPage,
    DeadLetterQuery,
    insert_sql,
    row_of,
    select_sql,
)
from gateway.ledger.dead_letters import page_of as letters_page
from gateway.ledger.event import EPOCH_DAY, UsageError, UsageEvent
from gateway.ledger.query import (
    EventPage,
    EventQuery,
    RollupQuery,
    RollupRow,
    events_sql,
    page_of,
    rollup_sql,
    rows_from,
)
from gateway.ledger.tables import EVENT_SELECT

log = structlog.get_logger(__name__)

DEFAULT_RETENTION_DAYS = 400
SQLITE_FILE = Path("usage") / "usage.sqlite3"


class StoreConfigError(ValueError):
    """A store URL or option that cannot work; the message never repeats a password."""


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """What one retention pass removed. ``events_deleted`` is None where whole PostgreSQL
    partitions were dropped without counting their rows."""

    cutoff: date
    days_dropped: tuple[date, ...]
    events_deleted: int | None
    rollup_rows_deleted: int


class UsageStore(Protocol):
    kind: str
    retention_days: int
    # A random id made once, with the store's schema, and read on open: replicas that share the
    # store share it, replicas with stores of their own differ (the Redis buffer that feeds a
    # store is named after it, so no event ever lands in a store other than its replica's).
    store_id: str

    async def open(self) -> None:
        """Connect and create or migrate the schema (idempotent, safe from many replicas)."""

    async def close(self) -> None: ...

    async def insert(self, events: Sequence[UsageEvent]) -> int:
        """Insert a batch in one transaction; returns how many were new. Events whose day
        is already outside the retention window are skipped (not counted)."""
        ...

    async def rollup(self, query: RollupQuery) -> list[RollupRow]: ...

    async def list_events(self, query: EventQuery) -> EventPage: ...

    async def maintain(self) -> RetentionResult:
        """Prepare the coming days (partitions) and drop days past retention."""
        ...

    async def schema_version(self) -> int: ...

    def refuses(self, exc: BaseException) -> bool:
        """Whether ``exc`` from ``insert`` means the store refused the data (an event of the
        batch it will never take) rather than that it is unavailable (try again later)."""
        ...

    async def keep_dead_letters(self, letters: Sequence[DeadLetter]) -> int:
        """Keep letters not kept yet (by ``letter_id``), durably; returns how many were new."""
        ...

    async def dead_letters(self, query: DeadLetterQuery) -> DeadLetterPage: ...

    async def count_dead_letters(self) -> int: ...

    async def drop_dead_letters(self, letter_ids: Sequence[str]) -> int:
        """Forget letters whose events are stored now; returns how many went."""
        ...


def utc_today(clock: Callable[[], float]) -> date:
    return datetime.fromtimestamp(clock(), UTC).date()


def retention_cutoff(today: date, retention_days: int) -> date:
    """The oldest day kept: ``retention_days`` days up to and including today."""
    return today - timedelta(days=retention_days - 1)


def check_retention_days(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 36_500:
        raise StoreConfigError("retention_days must be an integer from 1 to 36500")
    return value


def check_batch(events: Sequence[UsageEvent]) -> list[UsageEvent]:
    """Every item must be a ``UsageEvent`` within the store's bounds (``check_storable``)."""
    batch = list(events)
    for index, event in enumerate(batch):
        if not isinstance(event, UsageEvent):
            raise UsageError("event", f"item {index} is a {type(event).__name__}, not a UsageEvent")
        event.check_storable()
    return batch


def events_to_keep(events: Sequence[UsageEvent], cutoff: date) -> list[UsageEvent]:
    """The checked batch less the events whose day is already past retention (logged)."""
    batch = check_batch(events)
    first_day = (cutoff - EPOCH_DAY).days
    kept = [event for event in batch if event.day_number >= first_day]
    if len(kept) < len(batch):
        log.warning("usage_events_past_retention", skipped=len(batch) - len(kept))
    return kept


def versions_to_apply(current: int, latest: int) -> range:
    """The migrations a schema at version ``current`` still needs; a newer schema is refused."""
    if current > latest:
        raise StoreConfigError(
            f"the usage store's schema is version {current}, newer than this gateway's "
            f"({latest}): upgrade the gateway"
        )
    return range(current + 1, latest + 1)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def check_store_url(url: str) -> str:
    """Empty, ``sqlite:///<path>`` (a fourth slash for an absolute path) or
    ``postgresql://...``; anything else is refused."""
    url = url.strip()
    if not url:
        return url
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        return url
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or url == "sqlite:///":
            raise StoreConfigError(
                "a sqlite URL names a file: sqlite:///relative.sqlite3 or sqlite:////abs/usage.sqlite3"
            )
        return url
    raise StoreConfigError(
        f"unsupported usage store URL {redact(url)!r}: use empty (embedded SQLite),"
        " sqlite:///<path> or postgresql://user@host/db"
    )


@dataclass(frozen=True, slots=True)
class SqlDialect:
    """How a backend writes the ``n``-th parameter and a day into SQL, and reads a day and an
    event row back from it."""

    placeholder: Callable[[int], str]
    day_value: Callable[[date], Any]
    day_text: Callable[[Any], str]
    event_of: Callable[[Sequence[Any]], UsageEvent]


class StoreOptions(TypedDict, total=False):
    """The options every backend takes alike; their defaults are ``SqlStore``'s."""

    retention_days: int
    clock: Callable[[], float]


class SqlStore(ABC):
    """What both backends do alike: the retention clock, the checks before a write and the
    reads, over the SQL ``query`` builds. A backend sets ``kind`` and ``dialect`` and supplies
    ``_write`` (a checked, non-empty batch) and ``_fetch`` (the records of one SELECT)."""

    kind: str
    dialect: SqlDialect
    # What the backend's driver raises when the store refuses the data itself (a constraint,
    # a value out of a column's range), as opposed to the store being unreachable.
    refusals: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        *,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.retention_days = retention_days
        self.clock = clock
        self.store_id = ""

    def today(self) -> date:
        return utc_today(self.clock)

    def cutoff(self, today: date | None = None) -> date:
        return retention_cutoff(today or self.today(), self.retention_days)

    async def insert(self, events: Sequence[UsageEvent]) -> int:
        kept = events_to_keep(events, self.cutoff())
        if not kept:
            return 0
        return await self._write(kept)

    @abstractmethod
    async def _write(self, events: list[UsageEvent]) -> int:
        """Insert a checked, non-empty batch; the number of events new to the store."""

    @abstractmethod
    async def _fetch(self, sql: str, params: list[Any]) -> Sequence[Sequence[Any]]:
        """The rows of one SELECT."""

    @abstractmethod
    async def _write_rows(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        """Run ``sql`` once per row, all in one transaction; the rows it changed."""

    def refuses(self, exc: BaseException) -> bool:
        return isinstance(exc, (UsageError, *self.refusals))

    async def keep_dead_letters(self, letters: Sequence[DeadLetter]) -> int:
        rows = [row_of(letter, self.dialect.day_value(letter.day)) for letter in letters]
        return await self._write_rows(insert_sql(self.dialect.placeholder), rows) if rows else 0

    async def dead_letters(self, query: DeadLetterQuery) -> DeadLetterPage:
        sql, params = select_sql(query, self.dialect.placeholder)
        return letters_page(list(await self._fetch(sql, params)), query.limit)

    async def count_dead_letters(self) -> int:
        rows = await self._fetch("SELECT count(*) FROM usage_dead_letters", [])
        return int(rows[0][0])

    async def drop_dead_letters(self, letter_ids: Sequence[str]) -> int:
        sql = f"DELETE FROM usage_dead_letters WHERE letter_id = {self.dialect.placeholder(1)}"
        rows = [(letter_id,) for letter_id in letter_ids]
        return await self._write_rows(sql, rows) if rows else 0

    async def rollup(self, query: RollupQuery) -> list[RollupRow]:
        sql, params = rollup_sql(query, self.dialect.placeholder, self.dialect.day_value)
        return rows_from(query, await self._fetch(sql, params), self.dialect.day_text)

    async def list_events(self, query: EventQuery) -> EventPage:
        sql, params = events_sql(
            query, EVENT_SELECT, self.dialect.placeholder, self.dialect.day_value
        )
        records = await self._fetch(sql, params)
        return page_of([self.dialect.event_of(record) for record in records], query.limit)
