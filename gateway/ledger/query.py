"""What a report asks the store, and what it gets back; the SQL both backends share.

``RollupQuery`` is a date range ``[start, end)``, the dimensions to group by (none for one
grand total) and equality filters. It always reads a rollup table, never raw events: the plain
rollup per (day, key, team, model, provider, task), or the tag or end-user rollup when a tag or
user is grouped by or filtered on (those carry the same five dimensions, so every other filter
still applies). ``EventQuery`` pages through raw events newest first with an opaque cursor.
Bad parameters raise ``LedgerQueryError`` naming the parameter, for a 400 answer.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import date
from typing import Any

from gateway.ledger.event import MAX_TIME_MS, UsageError, UsageEvent, check_tag, day_of_ms
from gateway.ledger.record import check_id, label_problem
from gateway.ledger.tables import COUNTERS, ROLLUP_TABLES

GROUP_BYS = ("key", "team", "model", "provider", "task", "day", "tag", "user")
FILTERS = ("key_id", "team", "model", "provider", "task", "tag", "user")
MAX_EVENTS_LIMIT = 1000

# Report dimension -> rollup column.
DIMENSION_COLUMNS = {
    "key": "key_id",
    "team": "team",
    "model": "model",
    "provider": "provider",
    "task": "task",
    "day": "day",
    "tag": "tag",
    "user": "end_user",
}
FILTER_COLUMNS = {
    "key_id": "key_id",
    "team": "team",
    "model": "model",
    "provider": "provider",
    "task": "task",
    "tag": "tag",
    "user": "end_user",
}
ROLLUP_DIMENSIONS = ("day", "key_id", "team", "model", "provider", "task")


def event_counts(event: UsageEvent) -> tuple[int, ...]:
    """What one event adds to each counter, in ``COUNTERS`` order."""
    return (
        1,
        event.prompt_tokens,
        event.completion_tokens,
        event.cached_tokens,
        event.cache_write_tokens,
        event.cost_nanos,
        1 if event.is_error else 0,
        event.latency_ms,
        1 if event.streamed else 0,
        1 if event.estimated else 0,
    )


class LedgerQueryError(ValueError):
    """A bad query parameter; ``param`` names it for the 400 response."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


@dataclass(frozen=True, slots=True)
class Totals:
    """Exact integer sums of one group. ``latency_ms`` is a sum: divide by ``requests``."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cost_nanos: int = 0
    errors: int = 0
    latency_ms: int = 0
    streamed: int = 0
    estimated: int = 0

    @classmethod
    def of_event(cls, event: UsageEvent) -> Totals:
        return cls(*event_counts(event))

    def __add__(self, other: Totals) -> Totals:
        return Totals(*(a + b for a, b in zip(self.values(), other.values(), strict=True)))

    def values(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in COUNTERS)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class RollupRow:
    """``group`` holds the grouped values in ``RollupQuery.group_by`` order (days as ISO text)."""

    group: tuple[str, ...]
    totals: Totals


def _check_filter_value(param: str, value: object) -> None:
    problem = label_problem(value)
    if problem is not None:
        raise LedgerQueryError(param, problem)
    if param == "tag" and value:  # "" selects untagged requests
        try:
            check_tag(value)
        except UsageError as exc:
            raise LedgerQueryError("tag", str(exc).removeprefix("tags: ")) from None


def _check_range(start: object, end: object) -> None:
    for param, value in (("from", start), ("to", end)):
        if not isinstance(value, date) or hasattr(value, "hour"):
            raise LedgerQueryError(param, "must be a date")
    assert isinstance(start, date) and isinstance(end, date)
    if start >= end:
        raise LedgerQueryError("to", "must be after from (the range is [from, to))")


@dataclass(frozen=True, slots=True)
class UsageFilter:
    """Equality filters; None means no filter, "" matches the empty value (no team, no user)."""

    key_id: str | None = None
    team: str | None = None
    model: str | None = None
    provider: str | None = None
    task: str | None = None
    tag: str | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                _check_filter_value(item.name, value)

    def items(self) -> list[tuple[str, str]]:
        return [(name, getattr(self, name)) for name in FILTERS if getattr(self, name) is not None]


@dataclass(frozen=True, slots=True)
class RollupQuery:
    start: date
    end: date
    group_by: tuple[str, ...] = ()
    filters: UsageFilter = field(default_factory=UsageFilter)

    def __post_init__(self) -> None:
        _check_range(self.start, self.end)
        group_by = self.group_by
        if isinstance(group_by, str):
            group_by = (group_by,) if group_by else ()
            object.__setattr__(self, "group_by", group_by)
        if not isinstance(group_by, tuple | list):
            raise LedgerQueryError("group_by", "must be a list of dimensions")
        object.__setattr__(self, "group_by", tuple(group_by))
        for by in self.group_by:
            if by not in GROUP_BYS:
                raise LedgerQueryError("group_by", f"must be one of {', '.join(GROUP_BYS)}")
        if len(set(self.group_by)) != len(self.group_by):
            raise LedgerQueryError("group_by", "a dimension is repeated")
        if not isinstance(self.filters, UsageFilter):
            raise LedgerQueryError("filters", "must be a UsageFilter")
        if self.attribution_dimensions() == {"tag", "end_user"}:
            raise LedgerQueryError(
                "group_by", "tags and users cannot be combined in one query (grouped or filtered)"
            )

    def attribution_dimensions(self) -> set[str]:
        used = {DIMENSION_COLUMNS[by] for by in self.group_by}
        used |= {FILTER_COLUMNS[name] for name, _ in self.filters.items()}
        return used & {"tag", "end_user"}

    @property
    def table(self) -> str:
        extra = self.attribution_dimensions()
        return ROLLUP_TABLES[extra.pop() if extra else ""]


def rollup_sql(
    query: RollupQuery, placeholder: Callable[[int], str], day_value: Callable[[date], Any]
) -> tuple[str, list[Any]]:
    """SELECT over one rollup table. Column names come from fixed maps, values are parameters;
    ``placeholder(n)`` renders the n-th (1-based) parameter, ``day_value`` a day for the
    backend, and ``day_text`` (below) the day column as ISO text."""
    params: list[Any] = [day_value(query.start), day_value(query.end)]
    where = [f"day >= {placeholder(1)}", f"day < {placeholder(2)}"]
    for name, value in query.filters.items():
        params.append(value)
        where.append(f"{FILTER_COLUMNS[name]} = {placeholder(len(params))}")
    columns = [DIMENSION_COLUMNS[by] for by in query.group_by]
    sums = ", ".join(f"SUM({name})" for name in COUNTERS)
    select = ", ".join([*columns, sums]) if columns else sums
    sql = f"SELECT {select} FROM {query.table} WHERE {' AND '.join(where)}"
    if columns:
        listed = ", ".join(columns)
        sql += f" GROUP BY {listed} ORDER BY {listed}"
    return sql, params


def rows_from(
    query: RollupQuery, records: Sequence[Sequence[Any]], day_text: Callable[[Any], str]
) -> list[RollupRow]:
    """Turn SELECT rows into RollupRows; a grand total over no data is one row of zeros."""
    width = len(query.group_by)
    day_at = query.group_by.index("day") if "day" in query.group_by else -1
    rows = []
    for record in records:
        group = tuple(
            day_text(value) if index == day_at else str(value)
            for index, value in enumerate(record[:width])
        )
        sums = tuple(int(value or 0) for value in record[width:])
        rows.append(RollupRow(group, Totals(*sums)))
    if not query.group_by and not rows:
        rows.append(RollupRow((), Totals()))
    return rows


# -- raw events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventCursor:
    """Position after the last event of a page: (time_ms, event_id), newest first."""

    time_ms: int
    event_id: str

    def encode(self) -> str:
        raw = f"{self.time_ms}|{self.event_id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> EventCursor:
        return cls(*decode_position(text))


def decode_position(text: str) -> tuple[int, str]:
    """A page cursor's (time_ms, event_id), for the events and the audit log alike. Anything
    but a position this server could have written (a time no stored row can have, an id the
    ledger would refuse) is a ``LedgerQueryError`` naming ``cursor``: a 400, never a query
    the database cannot run."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        time_text, event_id = raw.split("|", 1)
        time_ms = int(time_text) if time_text.isascii() and time_text.isdigit() else -1
        check_id(UsageError, "cursor", event_id)
    except (ValueError, UnicodeDecodeError):  # RecordError is a ValueError
        raise LedgerQueryError("cursor", "is not one this server returned") from None
    if not 0 <= time_ms < MAX_TIME_MS:
        raise LedgerQueryError("cursor", "is not one this server returned")
    return time_ms, event_id


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Raw events in ``[start, end)`` (either may be None: no bound), newest first."""

    start: date | None = None
    end: date | None = None
    key_id: str | None = None
    model: str | None = None
    cursor: str | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        if self.start is not None and self.end is not None:
            _check_range(self.start, self.end)
        else:
            for param, value in (("from", self.start), ("to", self.end)):
                if value is not None and (not isinstance(value, date) or hasattr(value, "hour")):
                    raise LedgerQueryError(param, "must be a date")
        for param in ("key_id", "model"):
            value = getattr(self, param)
            if value is not None:
                _check_filter_value(param, value)
        limit = self.limit
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_EVENTS_LIMIT
        ):
            raise LedgerQueryError("limit", f"must be an integer from 1 to {MAX_EVENTS_LIMIT}")
        if self.cursor is not None:
            EventCursor.decode(self.cursor)  # refuse a bad cursor before any I/O

    @property
    def after(self) -> EventCursor | None:
        return EventCursor.decode(self.cursor) if self.cursor else None


@dataclass(frozen=True, slots=True)
class EventPage:
    events: list[UsageEvent]
    next_cursor: str | None

    @property
    def has_more(self) -> bool:
        return self.next_cursor is not None


def events_sql(
    query: EventQuery,
    select: str,
    placeholder: Callable[[int], str],
    day_value: Callable[[date], Any],
) -> tuple[str, list[Any]]:
    """``select`` (the event columns FROM the events table) narrowed to the query's page.

    Newest first by (time_ms, event_id); one row more than the limit tells whether a next
    page exists. The cursor also bounds the day, so PostgreSQL prunes newer partitions.
    """
    params: list[Any] = []
    where: list[str] = []

    def bind(value: Any) -> str:
        params.append(value)
        return placeholder(len(params))

    if query.start is not None:
        where.append(f"day >= {bind(day_value(query.start))}")
    if query.end is not None:
        where.append(f"day < {bind(day_value(query.end))}")
    if query.key_id is not None:
        where.append(f"key_id = {bind(query.key_id)}")
    if query.model is not None:
        where.append(f"model = {bind(query.model)}")
    after = query.after
    if after is not None:
        where.append(f"day <= {bind(day_value(day_of_ms(after.time_ms)))}")
        where.append(f"(time_ms, event_id) < ({bind(after.time_ms)}, {bind(after.event_id)})")
    sql = select
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY time_ms DESC, event_id DESC LIMIT {bind(query.limit + 1)}"
    return sql, params


def page_of(events: list[UsageEvent], limit: int) -> EventPage:
    """A page from up to ``limit + 1`` events read newest first."""
    if len(events) <= limit:
        return EventPage(events, None)
    last = events[limit - 1]
    return EventPage(events[:limit], EventCursor(last.time_ms, last.event_id).encode())
