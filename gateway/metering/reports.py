"""Usage reports read from the SQL usage store: per key, admin group-by, CSV, raw events, and
the cells the dashboard draws; each says how fresh it is.

Figures come from the store's rollup tables (``UsageStore.rollup``), never from raw events, and
are integers (tokens, nano-dollars) until the end: a JSON ``cost`` float next to the
authoritative integer ``cost_nanos``, and exact decimal text in CSV, so totals equal the sum of
the events exactly. Dates are UTC days; ranges here are inclusive (the store's are half-open).

Freshness. The store holds what the exporter has moved from the Redis buffer so far, a second
or so behind the requests. ``freshness()`` gives ``as_of`` (when the report was read),
``pending_export`` (events in the buffer, not in the store yet; None when Redis cannot say) and
``export_lag_s`` (the age of the oldest of them). An answered request's event is in the buffer
before the answer's last byte, so a report read with ``pending_export`` 0 counts every request
answered before ``as_of``, except those a replica spooled to disk while Redis was away (they
count once replayed).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any, Literal, NotRequired, TypedDict, TypeVar, get_args

import msgspec

from gateway.access.keys import KeyLabel
from gateway.errors import ServiceUnavailable
from gateway.ledger import (
    EventQuery,
    LedgerQueryError,
    RollupQuery,
    RollupRow,
    Totals,
    UsageEvent,
    UsageFilter,
    UsageStore,
)
from gateway.ledger.days import report_days
from gateway.ledger.event import day_of
from gateway.metering.attribution import BATCH_TAG_PREFIX
from gateway.metering.buffer import UsageBuffer
from gateway.money import format_usd_exact, nanos_to_usd
from gateway.store.connect import REDIS_FAILURES

T = TypeVar("T")
GroupBy = Literal["key", "team", "model", "provider", "task", "day", "tag", "user", "batch"]
GROUP_BYS: tuple[str, ...] = get_args(GroupBy)
# Attribution groupings: a request with two tags is in both tags' rows, so the report's totals
# are read apart (and a row of "" holds the requests without a tag or an end user).
ATTRIBUTION_GROUP_BYS = ("tag", "user")
MAX_EVENTS_LIMIT = 500
# The finest rollup cell: what the dashboard groups in every way it draws.
CELL_DIMENSIONS = ("day", "key", "team", "model", "provider", "task")


class ReportError(ValueError):
    """A bad report parameter; ``param`` names it for the 400 response."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


Usd = Annotated[float, msgspec.Meta(description="USD, a rendering of cost_nanos")]
Nanos = Annotated[int, msgspec.Meta(description="nano-dollars (1e-9 USD), exact")]
Day = Annotated[str, msgspec.Meta(description="a UTC day", extra_json_schema={"format": "date"})]
AsOf = Annotated[
    str,
    msgspec.Meta(description="when it was read (UTC)", extra_json_schema={"format": "date-time"}),
]
Pending = Annotated[
    int | None, msgspec.Meta(description="events not in the usage store yet; null: unknown")
]
Lag = Annotated[float | None, msgspec.Meta(description="age of the oldest of them, seconds")]
EpochSeconds = Annotated[float, msgspec.Meta(description="epoch seconds")]


class ReportRow(TypedDict):
    """One group's totals. Beside them, in a grouped report, the group's value under the
    dimension's name (``"model": "gpt-4.1"``), and with group_by=key the key's name and team
    now (null when it has none, or is gone)."""

    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int
    cost: Usd
    cost_nanos: Nanos
    errors: int
    error_rate: float
    avg_latency_ms: float
    streamed: int
    estimated: int
    key_name: NotRequired[str | None]
    key_team: NotRequired[str | None]


class Freshness(TypedDict):
    """How fresh a report is (docs/usage.md#freshness)."""

    as_of: AsOf
    pending_export: Pending
    export_lag_s: Lag


# ``from`` is a keyword: these two are declared in TypedDict's call form.
KeyUsage = TypedDict(
    "KeyUsage",
    {
        "object": Literal["usage"],
        "key_id": str,
        "days": int,
        "from": Day,
        "to": Day,
        "total_cost": float,
        "total_cost_nanos": int,
        "total_tokens": int,
        "prompt_tokens": int,
        "completion_tokens": int,
        "cached_tokens": int,
        "requests": int,
        "errors": int,
        "by_model": list[ReportRow],
        "by_day": list[ReportRow],
        "by_tag": NotRequired[list[ReportRow]],  # with group_by=tag
        "by_user": NotRequired[list[ReportRow]],  # with group_by=user
        **Freshness.__annotations__,
    },
)
UsageReport = TypedDict(
    "UsageReport",
    {
        "object": Literal["usage_report"],
        "group_by": GroupBy,
        "from": Day,
        "to": Day,
        "data": list[ReportRow],
        "totals": ReportRow,
        **Freshness.__annotations__,
    },
)


class UsageEventView(TypedDict):
    """A stored usage event (``event_view``)."""

    id: str
    time: EpochSeconds
    time_ms: int
    request_id: str
    key_id: str
    model: str
    provider: str
    team: str
    task: str
    route: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    cost_nanos: int
    cost_usd: float
    policy_version: str
    latency_ms: int
    ttft_ms: int | None
    status: int
    streamed: bool
    usage_source: str
    attempts: int
    end_user: str
    tags: list[str]
    price_catalogue: str


class UsageEvents(Freshness):
    object: Literal["list"]
    data: list[UsageEventView]
    has_more: bool
    next_cursor: str | None


def report_row(totals: Totals) -> ReportRow:
    """The store's integer totals of one group, as a report shows them."""
    return {
        "requests": totals.requests,
        "prompt_tokens": totals.prompt_tokens,
        "completion_tokens": totals.completion_tokens,
        "cached_tokens": totals.cached_tokens,
        "total_tokens": totals.total_tokens,
        "cost": nanos_to_usd(totals.cost_nanos),
        "cost_nanos": totals.cost_nanos,
        "errors": totals.errors,
        "error_rate": round(totals.errors / totals.requests, 6) if totals.requests else 0.0,
        "avg_latency_ms": (
            round(totals.latency_ms / totals.requests, 1) if totals.requests else 0.0
        ),
        "streamed": totals.streamed,
        "estimated": totals.estimated,
    }


@dataclass(frozen=True, slots=True)
class Group:
    model: str
    provider: str
    task: str
    team: str


@dataclass(slots=True)
class Cell:
    """One key's counters for one day and one model/provider/task/team group."""

    key_id: str
    day: date
    group: Group
    totals: Totals = field(default_factory=Totals)

    def dimension(self, by: str) -> str:
        if by == "key":
            return self.key_id
        if by == "day":
            return self.day.isoformat()
        return getattr(self.group, by)


def add_to(grouped: dict[str, Totals], value: str, totals: Totals) -> None:
    """Add ``totals`` to the group ``value`` of ``grouped``."""
    grouped[value] = grouped.get(value, Totals()) + totals


def group_cells(cells: Iterable[Cell], by: str) -> dict[str, Totals]:
    grouped: dict[str, Totals] = {}
    for cell in cells:
        add_to(grouped, cell.dimension(by), cell.totals)
    return grouped


def total_of(cells: Iterable[Cell]) -> Totals:
    return sum((cell.totals for cell in cells), Totals())


def days_between(start: date, end: date) -> list[date]:
    return [start + timedelta(days=offset) for offset in range((end - start).days + 1)]


def report_range(
    start: str | None, end: str | None, *, today: date, default_days: int
) -> tuple[date, date]:
    """The ``from``/``to`` of a report (``gateway.ledger.days``, the one day parser of every
    admin entry point) with its defaults; a refusal is a ``ReportError`` naming the param."""
    try:
        return report_days(start, end, today=today, default_days=default_days)
    except LedgerQueryError as exc:
        raise _report_error(exc) from None


def _csv_safe(value: Any) -> Any:
    # A leading = + - @ makes spreadsheets evaluate the cell; names come from clients.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


# Beside a key's id in reports: its name and team (now, not when the requests were made).
KEY_LABEL_COLUMNS = ("key_name", "key_team")
# The counters, in the order of a report row.
CSV_COLUMNS = tuple(report_row(Totals()))


def render_csv(rows: Sequence[dict[str, Any]], group_by: str) -> str:
    """The rows as CSV: the group, for keys their name and team, then the counters."""
    labels = KEY_LABEL_COLUMNS if group_by == "key" else ()
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((group_by, *labels, *CSV_COLUMNS))
    for row in rows:
        # Exact fixed-point USD from the integer, so a spreadsheet sum matches cost_nanos.
        values = [
            format_usd_exact(row["cost_nanos"]) if c == "cost" else row[c] for c in CSV_COLUMNS
        ]
        named = [_csv_safe(row.get(c) or "") for c in labels]
        writer.writerow((_csv_safe(row[group_by]), *named, *values))
    return out.getvalue()


def _day_filter(start: date, end: date) -> tuple[date, date]:
    """An inclusive range as the store's half-open one."""
    return start, end + timedelta(days=1)


def _rows_by(rows: Sequence[RollupRow]) -> dict[str, Totals]:
    return {row.group[0]: row.totals for row in rows}


def _batches_of(by_tag: dict[str, Totals]) -> dict[str, Totals]:
    """The batch tags' rows, by batch id."""
    return {
        tag.removeprefix(BATCH_TAG_PREFIX): totals
        for tag, totals in by_tag.items()
        if tag.startswith(BATCH_TAG_PREFIX)
    }


def _report_error(exc: LedgerQueryError) -> ReportError:
    """The store's refusal, named as the HTTP parameter (``key``, not ``key_id``)."""
    param = "key" if exc.param == "key_id" else exc.param
    return ReportError(param, f"{param} {exc.message}")


async def _from_store(read: Awaitable[T]) -> T:
    """A read of the store; any failure of it (the server down, the file unreadable) is a 503
    that names only the kind of error."""
    try:
        return await read
    except Exception as exc:  # every driver raises its own kinds
        raise ServiceUnavailable(f"the usage store is unavailable ({type(exc).__name__})") from exc


def event_view(event: UsageEvent) -> UsageEventView:
    """A stored event as ``/admin/usage/events`` shows it: the recorded fields under their
    usage-event names (``request_id``, ``time`` in epoch seconds, ``cost_usd`` rendered from
    ``cost_nanos``), plus the store's own (``time_ms``, attribution)."""
    return {
        "id": event.event_id,
        "time": event.time_ms / 1000,
        "time_ms": event.time_ms,
        "request_id": event.event_id,
        "key_id": event.key_id,
        "model": event.model,
        "provider": event.provider,
        "team": event.team,
        "task": event.task,
        "route": event.route,
        "prompt_tokens": event.prompt_tokens,
        "completion_tokens": event.completion_tokens,
        "cached_tokens": event.cached_tokens,
        "cache_write_tokens": event.cache_write_tokens,
        "cost_nanos": event.cost_nanos,
        "cost_usd": nanos_to_usd(event.cost_nanos),
        "policy_version": event.policy_version,
        "latency_ms": event.latency_ms,
        "ttft_ms": event.ttft_ms,
        "status": event.status,
        "streamed": event.streamed,
        "usage_source": event.usage_source,
        "attempts": event.attempts,
        "end_user": event.end_user,
        "tags": list(event.tags),
        "price_catalogue": event.price_catalogue,
    }


KeyLabels = Callable[[Sequence[str]], Awaitable[dict[str, KeyLabel]]]


@dataclass(eq=False)
class UsageReports:
    """Reports over one usage store; ``buffer`` (the Redis buffer feeding it) says how fresh
    they are, ``key_labels`` (``KeyStore.labels``) names the keys beside their ids.
    ``retention_days`` bounds a range (default: the store's)."""

    store: UsageStore
    buffer: UsageBuffer | None = None
    _: KW_ONLY
    key_labels: KeyLabels | None = None
    retention_days: int | None = None
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self.retention_days = self.retention_days or self.store.retention_days

    def today(self) -> date:
        return day_of(self.clock())

    async def freshness(self) -> Freshness:
        """``as_of``, ``pending_export`` and ``export_lag_s`` (see the module's docstring)."""
        now = self.clock()
        pending: int | None = None
        lag: float | None = None
        if self.buffer is not None:
            try:
                stats = await self.buffer.stats()
                pending, lag = stats.backlog, round(stats.lag_s(int(now * 1000)), 3)
            except (*REDIS_FAILURES, RuntimeError):  # unreachable, or not bound to a store
                pass
        as_of = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
        return {
            "as_of": as_of.replace("+00:00", "Z"),
            "pending_export": pending,
            "export_lag_s": lag,
        }

    async def _rollup(
        self, start: date, end: date, group_by: Sequence[str], key_id: str | None = None
    ) -> list[RollupRow]:
        first, after = _day_filter(start, end)
        try:
            query = RollupQuery(first, after, tuple(group_by), UsageFilter(key_id=key_id))
        except LedgerQueryError as exc:
            raise _report_error(exc) from None
        return await _from_store(self.store.rollup(query))

    async def cells(
        self, start: date, end: date, key_ids: Sequence[str] | None = None
    ) -> list[Cell]:
        """Every rollup cell (day, key, team, model, provider, task) of ``start..end``
        (inclusive), for the given keys or all."""
        targets: Sequence[str | None] = key_ids if key_ids is not None else [None]
        cells: list[Cell] = []
        for key_id in targets:
            for row in await self._rollup(start, end, CELL_DIMENSIONS, key_id):
                day, key, team, model, provider, task = row.group
                cells.append(
                    Cell(
                        key,
                        date.fromisoformat(day),
                        Group(model, provider, task, team),
                        row.totals,
                    )
                )
        return cells

    def check_range(self, start: date, end: date) -> None:
        if start > end:
            raise ReportError("from", "from must not be after to")
        if (end - start).days + 1 > self.retention_days:
            raise ReportError("from", f"the range may span at most {self.retention_days} days")

    async def usage_for_key(
        self, key_id: str, days: int = 30, group_by: str | None = None
    ) -> KeyUsage:
        """What ``GET /v1/usage?days=N&group_by=tag|user`` returns: the key's last N UTC days,
        today included, by model and by day, and with ``group_by`` also ``by_tag`` or
        ``by_user``."""
        if group_by is not None and group_by not in ATTRIBUTION_GROUP_BYS:
            raise ReportError("group_by", "group_by must be tag or user")
        if (
            isinstance(days, bool)
            or not isinstance(days, int)
            or not 1 <= days <= self.retention_days
        ):
            raise ReportError("days", f"days must be an integer from 1 to {self.retention_days}")
        end = self.today()
        start = end - timedelta(days=days - 1)
        rows = await self._rollup(start, end, ("day", "model"), key_id)
        by_day: dict[str, Totals] = {}
        by_model: dict[str, Totals] = {}
        for row in rows:
            day, model = row.group
            add_to(by_day, day, row.totals)
            add_to(by_model, model, row.totals)
        total = sum(by_day.values(), Totals())
        return {
            "object": "usage",
            "key_id": key_id,
            "days": days,
            "from": start.isoformat(),
            "to": end.isoformat(),
            "total_cost": nanos_to_usd(total.cost_nanos),
            "total_cost_nanos": total.cost_nanos,
            "total_tokens": total.total_tokens,
            "prompt_tokens": total.prompt_tokens,
            "completion_tokens": total.completion_tokens,
            "cached_tokens": total.cached_tokens,
            "requests": total.requests,
            "errors": total.errors,
            "by_model": [
                {"model": model, **report_row(totals)}
                for model, totals in sorted(
                    by_model.items(), key=lambda item: (-item[1].cost_nanos, item[0])
                )
            ],
            "by_day": [
                {"date": day.isoformat(), **report_row(by_day.get(day.isoformat(), Totals()))}
                for day in days_between(start, end)
            ],
            **await self._by_attribution(start, end, group_by, key_id),
            **await self.freshness(),
        }

    async def _by_attribution(
        self, start: date, end: date, group_by: str | None, key_id: str
    ) -> dict[str, Any]:
        if group_by is None:
            return {}
        grouped = _rows_by(await self._rollup(start, end, (group_by,), key_id))
        ordered = sorted(grouped.items(), key=lambda item: (-item[1].cost_nanos, item[0]))
        return {f"by_{group_by}": [{group_by: v, **report_row(t)} for v, t in ordered]}

    async def admin_usage(self, start: date, end: date, group_by: str = "key") -> UsageReport:
        """Rows grouped by one dimension over ``start..end`` inclusive; spend-descending,
        except ``day`` which lists every day in order."""
        if group_by not in GROUP_BYS:
            raise ReportError("group_by", f"group_by must be one of {', '.join(GROUP_BYS)}")
        self.check_range(start, end)
        if group_by == "batch":  # a batch's lines carry its tag: the tag rollup, those tags
            grouped = _batches_of(_rows_by(await self._rollup(start, end, ("tag",))))
        else:
            grouped = _rows_by(await self._rollup(start, end, (group_by,)))
        if group_by == "day":
            ordered = [
                (d.isoformat(), grouped.get(d.isoformat(), Totals()))
                for d in days_between(start, end)
            ]
        else:
            ordered = sorted(grouped.items(), key=lambda item: (-item[1].cost_nanos, item[0]))
        if group_by in ATTRIBUTION_GROUP_BYS:
            daily = await self._rollup(start, end, ("day",))
            total = sum((row.totals for row in daily), Totals())
        else:
            total = sum(grouped.values(), Totals())
        rows = [{group_by: value, **report_row(totals)} for value, totals in ordered]
        if group_by == "key":
            await self.label_keys(rows)
        return {
            "object": "usage_report",
            "group_by": group_by,
            "from": start.isoformat(),
            "to": end.isoformat(),
            "data": rows,
            "totals": report_row(total),
            **await self.freshness(),
        }

    async def label_keys(self, rows: list[dict[str, Any]], id_field: str = "key") -> None:
        """Put each key's name and team (``key_name``, ``key_team``) beside its id in
        ``rows``; a Redis that cannot say leaves them None, the figures still stand."""
        labels: dict[str, KeyLabel] = {}
        if self.key_labels is not None and rows:
            try:
                labels = await self.key_labels([row[id_field] for row in rows])
            except REDIS_FAILURES:
                labels = {}
        for row in rows:
            label = labels.get(row[id_field])
            row["key_name"] = label.name if label else None
            row["key_team"] = label.team if label else None

    async def grouped(self, start: date, end: date, by: str) -> list[tuple[str, Totals]]:
        """Totals by one dimension over ``start..end`` inclusive, largest spend first (the
        dashboard's tag and end-user tables)."""
        grouped = _rows_by(await self._rollup(start, end, (by,)))
        return sorted(grouped.items(), key=lambda item: (-item[1].cost_nanos, item[0]))

    async def events(
        self,
        *,
        key: str | None = None,
        model: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> UsageEvents:
        """Raw events, newest first; ``next_cursor`` pages on."""
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_EVENTS_LIMIT
        ):
            raise ReportError("limit", f"limit must be an integer from 1 to {MAX_EVENTS_LIMIT}")
        try:
            query = EventQuery(key_id=key, model=model, cursor=cursor, limit=limit)
        except LedgerQueryError as exc:
            raise _report_error(exc) from None
        page = await _from_store(self.store.list_events(query))
        return {
            "object": "list",
            "data": [event_view(event) for event in page.events],
            "has_more": page.has_more,
            "next_cursor": page.next_cursor,
            **await self.freshness(),
        }


def validate_key_filter(value: str | None) -> str | None:
    """The ``key`` filter of the events API must be a well-formed key id, if given."""
    if value is None or value == "":
        return None
    if len(value) > 200 or any(ch in "{}" or ch.isspace() for ch in value):
        raise ReportError("key", "key must be a key id")
    return value


__all__ = [
    "GROUP_BYS",
    "Cell",
    "Group",
    "ReportError",
    "Totals",
    "UsageReports",
    "days_between",
    "event_view",
    "group_cells",
    "render_csv",
    "report_range",
    "report_row",
    "total_of",
    "validate_key_filter",
]
