"""Usage reports read from the ledger's Redis data: per key, admin group-by, CSV, raw events.

Every figure is summed as integers (tokens, nano-dollars) and only rendered at the end: a JSON
``cost`` float next to the authoritative integer ``cost_nanos``, and exact decimal text in CSV,
so totals equal the sum of the events exactly. Aggregates written before nano-dollars (metric
``cost``, micro-dollars) are read x1000. Reports that span keys iterate the
ledger's key-index sets and read each key's own hash-tagged data, so they stay correct when
keys are spread over the slots of a Redis Cluster.
"""

from __future__ import annotations

import base64
import csv
import heapq
import io
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from types import MappingProxyType
from typing import Any

import orjson
from redis.asyncio import Redis

from gateway.errors import echo
from gateway.metering.ledger import (
    KEY_INDEX,
    Group,
    active_day_key,
    day_hash_key,
    day_of,
    parse_group,
    stream_key,
    upgrade_event_dict,
)
from gateway.money import NANOS_PER_MICRO, format_usd_exact, nanos_to_usd

GROUP_BYS = ("key", "team", "model", "provider", "task", "day")
PIPELINE_CHUNK = 500
MAX_EVENTS_LIMIT = 500
# A page with a rare model filter stops scanning here and hands back a cursor instead.
MAX_SCANNED_PER_PAGE = 20_000


class ReportError(ValueError):
    """A bad report parameter; ``param`` names it for the 400 response."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


# The cost metric of aggregates written before nano-dollars, in micro-dollars.
LEGACY_COST_METRIC = "cost"

# Ledger metric name -> Totals attribute.
METRIC_ATTRS = MappingProxyType(
    {
        "req": "requests",
        "prompt": "prompt_tokens",
        "completion": "completion_tokens",
        "cached": "cached_tokens",
        "nano": "cost_nanos",
        "err": "errors",
        "lat": "latency_ms",
        "streamed": "streamed",
        "est": "estimated",
    }
)


@dataclass(slots=True)
class Totals:
    """Integer counters of one group; ``add_metric`` takes the ledger's metric names."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_nanos: int = 0
    errors: int = 0
    latency_ms: int = 0
    streamed: int = 0
    estimated: int = 0

    def add_metric(self, metric: str, value: int) -> None:
        attr = METRIC_ATTRS.get(metric)
        if attr is not None:  # fields from a newer ledger version are ignored, not fatal
            setattr(self, attr, getattr(self, attr) + value)
        elif metric == LEGACY_COST_METRIC:
            self.cost_nanos += value * NANOS_PER_MICRO

    def merge(self, other: Totals) -> None:
        for attr in METRIC_ATTRS.values():
            setattr(self, attr, getattr(self, attr) + getattr(other, attr))

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_row(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "total_tokens": self.total_tokens,
            "cost": nanos_to_usd(self.cost_nanos),
            "cost_nanos": self.cost_nanos,
            "errors": self.errors,
            "error_rate": round(self.errors / self.requests, 6) if self.requests else 0.0,
            "avg_latency_ms": round(self.latency_ms / self.requests, 1) if self.requests else 0.0,
            "streamed": self.streamed,
            "estimated": self.estimated,
        }


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


def group_cells(cells: Iterable[Cell], by: str) -> dict[str, Totals]:
    grouped: dict[str, Totals] = {}
    for cell in cells:
        grouped.setdefault(cell.dimension(by), Totals()).merge(cell.totals)
    return grouped


def total_of(cells: Iterable[Cell]) -> Totals:
    total = Totals()
    for cell in cells:
        total.merge(cell.totals)
    return total


def days_between(start: date, end: date) -> list[date]:
    return [start + timedelta(days=offset) for offset in range((end - start).days + 1)]


def parse_day(value: str | None, param: str, default: date) -> date:
    if value is None or value == "":
        return default
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ReportError(
            param, f"{param} must be a date as YYYY-MM-DD, got {echo(value)}"
        ) from None


def _csv_safe(value: Any) -> Any:
    # A leading = + - @ makes spreadsheets evaluate the cell; names come from clients.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


CSV_COLUMNS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "total_tokens",
    "cost",
    "cost_nanos",
    "errors",
    "error_rate",
    "avg_latency_ms",
    "streamed",
    "estimated",
)


def render_csv(rows: Sequence[dict[str, Any]], group_by: str) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((group_by, *CSV_COLUMNS))
    for row in rows:
        # Exact fixed-point USD from the integer, so a spreadsheet sum matches cost_nanos.
        values = [
            format_usd_exact(row["cost_nanos"]) if c == "cost" else row[c] for c in CSV_COLUMNS
        ]
        writer.writerow((_csv_safe(row[group_by]), *values))
    return out.getvalue()


def _encode_cursor(stream_id: bytes, key_id: str) -> str:
    raw = stream_id + b"|" + key_id.encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[tuple[int, int], str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stream_id, key_id = raw.split(b"|", 1)
        return _parse_stream_id(stream_id), key_id.decode()
    except (ValueError, UnicodeDecodeError):
        raise ReportError("cursor", "cursor is not one this server returned") from None


def _parse_stream_id(stream_id: bytes) -> tuple[int, int]:
    ms, seq = stream_id.split(b"-")
    return int(ms), int(seq)


@dataclass(slots=True)
class _Head:
    """The newest unconsumed event of one key's stream, ordered for a max-first heap."""

    position: tuple[int, int]
    key_id: str
    stream_id: bytes
    payload: bytes

    def __lt__(self, other: _Head) -> bool:
        # heapq pops the smallest: make "newer (then larger key id)" the smallest.
        return (self.position, self.key_id) > (other.position, other.key_id)


class _KeyStream:
    """Reads one key's stream newest-first in chunks, starting below a cursor."""

    def __init__(self, redis: Redis, key_id: str, upper: str, chunk: int) -> None:
        self.redis = redis
        self.key_id = key_id
        self.upper = upper  # XREVRANGE max bound: "+", "<id>" or "(<id>"
        self.chunk = chunk  # entries per refill
        self.buffer: deque[tuple[bytes, dict[bytes, bytes]]] = deque()
        self.exhausted = False

    def accept(self, entries: list[tuple[bytes, dict[bytes, bytes]]], requested: int) -> None:
        self.buffer = deque(entries)
        if len(entries) < requested:
            self.exhausted = True
        elif entries:
            self.upper = "(" + entries[-1][0].decode()

    async def refill(self) -> None:
        entries = await self.redis.xrevrange(stream_key(self.key_id), self.upper, "-", self.chunk)
        self.accept(entries, self.chunk)

    def pop(self) -> _Head | None:
        if not self.buffer:
            return None
        stream_id, fields = self.buffer.popleft()
        return _Head(_parse_stream_id(stream_id), self.key_id, stream_id, fields.get(b"e", b"{}"))


class UsageReports:
    def __init__(
        self,
        redis: Redis,
        *,
        retention_days: int = 400,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.retention_days = retention_days
        self.clock = clock

    def today(self) -> date:
        return day_of(self.clock())

    # -- aggregates ----------------------------------------------------------------------

    async def _pipelined(self, calls: Sequence[Callable[[Any], Any]]) -> list[Any]:
        replies: list[Any] = []
        for start in range(0, len(calls), PIPELINE_CHUNK):
            pipe = self.redis.pipeline(transaction=False)
            for call in calls[start : start + PIPELINE_CHUNK]:
                call(pipe)
            replies.extend(await pipe.execute())
        return replies

    async def active_pairs(self, start: date, end: date) -> list[tuple[str, date]]:
        """(key id, day) pairs with usage, from the per-day active-key sets."""
        days = days_between(start, end)
        replies = await self._pipelined(
            [lambda p, d=d: p.smembers(active_day_key(d)) for d in days]
        )
        return [
            (member.decode(), day)
            for day, members in zip(days, replies, strict=True)
            for member in sorted(members)
        ]

    async def cells(
        self, start: date, end: date, key_ids: Sequence[str] | None = None
    ) -> list[Cell]:
        """All aggregate cells for days ``start..end`` (inclusive), for the given or all keys."""
        if key_ids is None:
            pairs = await self.active_pairs(start, end)
        else:
            pairs = [(key_id, day) for key_id in key_ids for day in days_between(start, end)]
        replies = await self._pipelined(
            [lambda p, k=k, d=d: p.hgetall(day_hash_key(k, d)) for k, d in pairs]
        )
        groups: dict[str, Group] = {}  # many fields share one group prefix: parse it once
        cells: list[Cell] = []
        for (key_id, day), fields in zip(pairs, replies, strict=True):
            by_group: dict[Group, Cell] = {}
            for raw_field, raw_value in fields.items():
                prefix, metric = raw_field.decode().rsplit(":", 1)
                group = groups.get(prefix)
                if group is None:
                    group = groups[prefix] = parse_group(prefix)
                cell = by_group.get(group)
                if cell is None:
                    cell = by_group[group] = Cell(key_id, day, group)
                cell.totals.add_metric(metric, int(raw_value))
            cells.extend(by_group.values())
        return cells

    def check_range(self, start: date, end: date) -> None:
        if start > end:
            raise ReportError("from", "from must not be after to")
        if (end - start).days + 1 > self.retention_days:
            raise ReportError("from", f"the range may span at most {self.retention_days} days")

    async def usage_for_key(self, key_id: str, days: int = 30) -> dict[str, Any]:
        """What ``GET /v1/usage?days=N`` returns: the key's last N UTC days, today included."""
        if (
            isinstance(days, bool)
            or not isinstance(days, int)
            or not 1 <= days <= self.retention_days
        ):
            raise ReportError("days", f"days must be an integer from 1 to {self.retention_days}")
        end = self.today()
        start = end - timedelta(days=days - 1)
        cells = await self.cells(start, end, [key_id])
        total = total_of(cells)
        by_day = group_cells(cells, "day")
        by_model = group_cells(cells, "model")
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
                {"model": model, **totals.as_row()}
                for model, totals in sorted(
                    by_model.items(), key=lambda item: (-item[1].cost_nanos, item[0])
                )
            ],
            "by_day": [
                {"date": day.isoformat(), **by_day.get(day.isoformat(), Totals()).as_row()}
                for day in days_between(start, end)
            ],
        }

    async def admin_usage(self, start: date, end: date, group_by: str = "key") -> dict[str, Any]:
        """Rows grouped by one dimension over ``start..end`` inclusive; spend-descending,
        except ``day`` which lists every day in order."""
        if group_by not in GROUP_BYS:
            raise ReportError("group_by", f"group_by must be one of {', '.join(GROUP_BYS)}")
        self.check_range(start, end)
        cells = await self.cells(start, end)
        grouped = group_cells(cells, group_by)
        if group_by == "day":
            ordered = [
                (d.isoformat(), grouped.get(d.isoformat(), Totals()))
                for d in days_between(start, end)
            ]
        else:
            ordered = sorted(grouped.items(), key=lambda item: (-item[1].cost_nanos, item[0]))
        return {
            "object": "usage_report",
            "group_by": group_by,
            "from": start.isoformat(),
            "to": end.isoformat(),
            "data": [{group_by: value, **totals.as_row()} for value, totals in ordered],
            "totals": total_of(cells).as_row(),
        }

    # -- raw events ----------------------------------------------------------------------

    async def events(
        self,
        *,
        key: str | None = None,
        model: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """Raw events, newest recorded first, merged across keys; ``next_cursor`` pages on."""
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_EVENTS_LIMIT
        ):
            raise ReportError("limit", f"limit must be an integer from 1 to {MAX_EVENTS_LIMIT}")
        after = _decode_cursor(cursor) if cursor else None
        if key is not None:
            key_ids = [key]
        else:
            key_ids = sorted(member.decode() for member in await self.redis.smembers(KEY_INDEX))
        chunk = min(limit + 1, MAX_EVENTS_LIMIT) if model is None else MAX_EVENTS_LIMIT
        # Over many keys, a page needs only a few newest entries of each: start small and
        # refill (with ``chunk``) only the streams the merge actually drains.
        first = min(chunk, max(8, -(-2 * chunk // max(len(key_ids), 1))))
        streams = [_KeyStream(self.redis, k, self._upper_bound(k, after), chunk) for k in key_ids]
        replies = await self._pipelined(
            [lambda p, s=s: p.xrevrange(stream_key(s.key_id), s.upper, "-", first) for s in streams]
        )
        heap: list[_Head] = []
        for stream, entries in zip(streams, replies, strict=True):
            stream.accept(entries, first)
            self._push(heap, stream)
        by_key = {s.key_id: s for s in streams}

        data: list[dict[str, Any]] = []
        last: _Head | None = None
        scanned = 0
        while heap and len(data) < limit and scanned < MAX_SCANNED_PER_PAGE:
            head = heapq.heappop(heap)
            stream = by_key[head.key_id]
            if not stream.buffer and not stream.exhausted:
                await stream.refill()
            self._push(heap, stream)
            last, scanned = head, scanned + 1
            event = orjson.loads(head.payload)
            if model is not None and event.get("model") != model:
                continue
            data.append({"id": head.stream_id.decode(), **_event_view(event)})
        more = bool(heap) and last is not None
        return {
            "object": "list",
            "data": data,
            "has_more": more,
            "next_cursor": _encode_cursor(last.stream_id, last.key_id) if more and last else None,
        }

    @staticmethod
    def _upper_bound(key_id: str, after: tuple[tuple[int, int], str] | None) -> str:
        if after is None:
            return "+"
        (ms, seq), after_key = after
        # Order is (stream id, key id) descending: for smaller key ids an equal stream id is
        # still unseen, for the cursor's key and larger ones it was already returned.
        return f"{ms}-{seq}" if key_id < after_key else f"({ms}-{seq}"

    @staticmethod
    def _push(heap: list[_Head], stream: _KeyStream) -> None:
        head = stream.pop()
        if head is not None:
            heapq.heappush(heap, head)


def _event_view(event: dict[str, Any]) -> dict[str, Any]:
    """A stored event in today's fields (older ones carry micro-dollars)."""
    if "cost_micros" not in event:
        return event
    upgraded = upgrade_event_dict(event)
    upgraded["cost_usd"] = nanos_to_usd(upgraded.get("cost_nanos", 0))
    return upgraded


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
    "ReportError",
    "Totals",
    "UsageReports",
    "days_between",
    "group_cells",
    "parse_day",
    "render_csv",
    "total_of",
    "validate_key_filter",
]
