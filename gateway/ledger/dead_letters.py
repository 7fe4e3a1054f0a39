"""Dead letters: usage events the store could not keep, kept beside it until an admin replays them.

The exporter never drops an entry of the Redis buffer it could not store (an event the ledger
refuses, bytes no version can read, a batch the database refuses for one of its events): it
writes a ``DeadLetter`` here first, in the same SQL store as the usage, then acknowledges the
entry. The table is durable (the store's own transactions) and bounded by the store's
retention (a letter goes with the day it failed on, as usage does); Redis keeps nothing of it.
A letter is identified by a hash of its payload, so a re-delivered entry is kept once.

``DeadLetterQuery`` pages the letters oldest first with an opaque cursor; replaying them is
the metering's business (``gateway.metering.dead_letters``): it decodes the payload as the
exporter does, stores what the store now takes, and drops those letters.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any, Literal, TypedDict

import msgspec
import orjson

from gateway.ledger.event import day_of_ms
from gateway.ledger.query import LedgerQueryError, decode_position
from gateway.ledger.record import label_problem

MAX_DEAD_LETTER_LIMIT = 500
MAX_REASON_LENGTH = 500
LETTER_ID_PATTERN = r"^[0-9a-f]{32}$"
LetterId = Annotated[str, msgspec.Meta(pattern=LETTER_ID_PATTERN)]
_LETTER_ID = re.compile(LETTER_ID_PATTERN)

COLUMNS = ("letter_id", "failed_ms", "event_id", "key_id", "field", "reason", "payload")


def _table_sql(text: str, big: str, day: str, blob: str, options: str) -> str:
    return f"""
CREATE TABLE usage_dead_letters (
  letter_id {text} NOT NULL PRIMARY KEY,
  failed_ms {big} NOT NULL,
  day {day} NOT NULL,
  event_id {text} NOT NULL,
  key_id {text} NOT NULL,
  field {text} NOT NULL,
  reason {text} NOT NULL,
  payload {blob} NOT NULL
){options};
CREATE INDEX usage_dead_letters_time ON usage_dead_letters (failed_ms, letter_id);
CREATE INDEX usage_dead_letters_day ON usage_dead_letters (day);
"""


# Schema version 4 of each backend; a shipped migration: the text never changes.
SQLITE_MIGRATION = _table_sql("TEXT", "INTEGER", "INTEGER", "BLOB", " STRICT")
POSTGRES_MIGRATION = _table_sql("text", "bigint", "date", "bytea", "")


def letter_id_of(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:32]


def is_letter_id(value: object) -> bool:
    return isinstance(value, str) and _LETTER_ID.fullmatch(value) is not None


def _shown(text: str, limit: int) -> str:
    """Text safe in any column: what the label rule would refuse becomes ``?``."""
    return "".join(ch if ch.isprintable() else "?" for ch in text[:limit])


def _label_or_empty(value: object) -> str:
    return value if isinstance(value, str) and value and label_problem(value) is None else ""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One buffer entry the store could not keep: its bytes exactly as written, and why."""

    letter_id: str
    failed_ms: int
    event_id: str  # the event's id when the payload names one, else ""
    key_id: str
    field: str  # what was refused: an event field, "event" (unreadable) or "store"
    reason: str
    payload: bytes

    @classmethod
    def of(cls, payload: bytes, *, field: str, reason: str, failed_ms: int) -> DeadLetter:
        ids: dict[str, Any] = {}
        try:
            decoded = orjson.loads(payload)
            if isinstance(decoded, dict):
                ids = decoded
        except orjson.JSONDecodeError:
            pass
        return cls(
            letter_id=letter_id_of(payload),
            failed_ms=failed_ms,
            event_id=_label_or_empty(ids.get("request_id")),
            key_id=_label_or_empty(ids.get("key_id")),
            field=_shown(field, 100),
            reason=_shown(reason, MAX_REASON_LENGTH),
            payload=bytes(payload),
        )

    @property
    def day(self) -> date:
        return day_of_ms(self.failed_ms)

    def view(self) -> DeadLetterView:
        """As ``GET /admin/usage/dead-letters`` lists it: the event as JSON when it is JSON."""
        try:
            event: Any = orjson.loads(self.payload)
        except orjson.JSONDecodeError:
            event = None
        return {
            "object": "usage_dead_letter",
            "id": self.letter_id,
            "failed_at_ms": self.failed_ms,
            "event_id": self.event_id,
            "key_id": self.key_id,
            "field": self.field,
            "reason": self.reason,
            "event": event,
            "payload": self.payload.decode("utf-8", "replace"),
        }


class DeadLetterView(TypedDict):
    """A dead letter as ``GET /admin/usage/dead-letters`` lists it (``DeadLetter.view``)."""

    object: Literal["usage_dead_letter"]
    id: LetterId
    failed_at_ms: int
    event_id: str
    key_id: str
    field: str
    reason: str
    event: Annotated[Any, msgspec.Meta(description="the payload as JSON, null when it is not JSON")]
    payload: str


@dataclass(frozen=True, slots=True)
class DeadLetterQuery:
    """Oldest first; ``cursor`` is a page's ``next_cursor``, ``ids`` picks letters by id."""

    limit: int = 100
    cursor: str | None = None
    ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        limit = self.limit
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_DEAD_LETTER_LIMIT
        ):
            raise LedgerQueryError("limit", f"must be an integer from 1 to {MAX_DEAD_LETTER_LIMIT}")
        if self.cursor is not None:
            _, letter_id = decode_position(self.cursor)
            if not is_letter_id(letter_id):
                raise LedgerQueryError("cursor", "is not one this server returned")
        ids = self.ids
        if ids is not None and (
            len(ids) > MAX_DEAD_LETTER_LIMIT or not all(map(is_letter_id, ids))
        ):
            raise LedgerQueryError("ids", f"must be at most {MAX_DEAD_LETTER_LIMIT} letter ids")

    @property
    def after(self) -> tuple[int, str] | None:
        return decode_position(self.cursor) if self.cursor else None


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    letters: list[DeadLetter]
    next_cursor: str | None


def select_sql(query: DeadLetterQuery, mark: Any) -> tuple[str, list[Any]]:
    """One page of letters (one row more than the limit tells whether another page exists)."""
    params: list[Any] = []

    def bind(value: Any) -> str:
        params.append(value)
        return mark(len(params))

    where = []
    after = query.after
    if after is not None:
        where.append(f"(failed_ms, letter_id) > ({bind(after[0])}, {bind(after[1])})")
    if query.ids is not None:
        where.append(f"letter_id IN ({', '.join(bind(i) for i in query.ids) or 'NULL'})")
    sql = f"SELECT {', '.join(COLUMNS)} FROM usage_dead_letters"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY failed_ms, letter_id LIMIT {bind(query.limit + 1)}"
    return sql, params


def page_of(rows: list[Any], limit: int) -> DeadLetterPage:
    letters = [
        DeadLetter(str(r[0]), int(r[1]), str(r[2]), str(r[3]), str(r[4]), str(r[5]), bytes(r[6]))
        for r in rows
    ]
    if len(letters) <= limit:
        return DeadLetterPage(letters, None)
    last = letters[limit - 1]
    return DeadLetterPage(letters[:limit], _cursor(last))


def _cursor(letter: DeadLetter) -> str:
    raw = f"{letter.failed_ms}|{letter.letter_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def insert_sql(mark: Any) -> str:
    names = (*COLUMNS, "day")
    marks = ", ".join(mark(n) for n in range(1, len(names) + 1))
    return (
        f"INSERT INTO usage_dead_letters ({', '.join(names)}) VALUES ({marks})"
        " ON CONFLICT (letter_id) DO NOTHING"
    )


def row_of(letter: DeadLetter, day: Any) -> tuple[Any, ...]:
    return (
        letter.letter_id,
        letter.failed_ms,
        letter.event_id,
        letter.key_id,
        letter.field,
        letter.reason,
        letter.payload,
        day,
    )
