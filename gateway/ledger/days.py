"""The days a report or an audit query may name: one parser for every admin and dashboard
entry point (``/admin/usage``, ``/admin/audit``, ``/admin/ui``, ``/admin/ui/audit``, the CLI).

A day is ``YYYY-MM-DD`` (UTC) from ``FIRST_DAY`` to ``LAST_DAY``, the days a stored time can
fall on (``event.MIN_TIME_MS``/``MAX_TIME_MS`` bound every event's time; 1970 is kept for
the audit log's ranges). Anything else is refused with a ``LedgerQueryError`` naming the
parameter, so no range arithmetic downstream (a day after ``to``, a default ``from`` some days
before it) can overflow the calendar. Ranges are inclusive here; the stores' are half-open.
"""

from __future__ import annotations

import re
from datetime import date, timedelta

from gateway.ledger.event import EPOCH_DAY, MAX_TIME_MS, day_of_ms
from gateway.ledger.query import LedgerQueryError

FIRST_DAY = EPOCH_DAY
LAST_DAY = day_of_ms(MAX_TIME_MS - 1)
_DAY_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_day(text: str | None, param: str) -> date | None:
    """``text`` as a day, None when empty; ``LedgerQueryError`` naming ``param`` otherwise."""
    if text is None or text == "":
        return None
    if not isinstance(text, str) or not _DAY_TEXT.fullmatch(text):
        raise LedgerQueryError(param, f"must be a date as YYYY-MM-DD, got {str(text)[:40]!r}")
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise LedgerQueryError(param, f"{text!r} is not a calendar date") from None
    if not FIRST_DAY <= day <= LAST_DAY:
        raise LedgerQueryError(
            param, f"must be a day from {FIRST_DAY.isoformat()} to {LAST_DAY.isoformat()}"
        )
    return day


def parse_days(start: str | None, end: str | None) -> tuple[date | None, date | None]:
    """``from`` and ``to`` (inclusive, either may be empty: no bound), in order."""
    first, last = parse_day(start, "from"), parse_day(end, "to")
    if first is not None and last is not None and first > last:
        raise LedgerQueryError("from", "must not be after to")
    return first, last


def report_days(
    start: str | None, end: str | None, *, today: date, default_days: int
) -> tuple[date, date]:
    """An inclusive range with its defaults: ``to`` today, ``from`` ``default_days`` days up
    to ``to`` (never before ``FIRST_DAY``)."""
    first, last = parse_days(start, end)
    last = last if last is not None else min(max(today, FIRST_DAY), LAST_DAY)
    if first is None:
        back = min(default_days - 1, (last - FIRST_DAY).days)
        first = last - timedelta(days=back)
    if first > last:
        raise LedgerQueryError("from", "must not be after to")
    return first, last
