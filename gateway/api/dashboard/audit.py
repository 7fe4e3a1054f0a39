"""How the dashboard's audit page reads an entry: who did it, said once; what changed, field
by field, in words a person reads (ISO UTC times, dollars, lists), not the JSON the API keeps.
The API (``GET /admin/audit``) still gives the values whole."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gateway.audit.trail import entry_view
from gateway.ledger.audit import AuditEntry
from gateway.money import format_usd_money, stored_usd_to_nanos

NONE = "—"
_KINDS = {"token": "admin token", "cli": "CLI"}
# Fields that are Unix times, money in nano-dollars, or money in USD.
_TIME_SUFFIXES = ("_at", "_until")
_NANOS_SUFFIX = "_nanos"
_USD_SUFFIX = "_usd"

Detail = tuple[str, str | None, str | None]  # field, before (None: absent), after


def audit_row(entry: AuditEntry) -> dict[str, Any]:
    """An entry as the page draws it: the API's view plus ``when``, ``actor`` and
    ``details``."""
    view = entry_view(entry)
    when = datetime.fromtimestamp(entry.time_ms / 1000, UTC)
    return {
        **view,
        "when": when.strftime("%Y-%m-%d %H:%M:%S"),
        "when_iso": when.isoformat(timespec="seconds"),
        "actor": actor_label(view["actor_kind"], view["actor_name"]),
        "details": details(view["before"], view["after"]),
    }


def actor_label(kind: str, name: str) -> str:
    """``bootstrap admin key``, ``pat (admin token)``, ``ops (CLI)``: the name once, with
    what kind of credential it is when that is not the name itself."""
    if kind == "bootstrap":
        return "bootstrap admin key"
    what = _KINDS.get(kind, kind)
    return f"{name} ({what})" if what and what != name else name


def details(before: Any, after: Any) -> list[Detail]:
    """Each field an action changed (before and after), or, for a creation or a deletion,
    each field it had (empty ones left out)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        fields = sorted(set(before) | set(after))
        return [
            (f, readable(f, before.get(f)), readable(f, after.get(f)))
            for f in fields
            if before.get(f) != after.get(f)
        ]
    if isinstance(after, Mapping):
        return [
            (f, None, readable(f, v))
            for f, v in after.items()
            if _shown(v) and f not in _SAID_ELSEWHERE
        ]
    if isinstance(before, Mapping):
        return [
            (f, readable(f, v), None)
            for f, v in before.items()
            if _shown(v) and f not in _SAID_ELSEWHERE
        ]
    if before is None and after is None:
        return []
    return [("value", readable("", before), readable("", after))]


_SAID_ELSEWHERE = ("object",)  # the target names what it is


def _shown(value: Any) -> bool:
    return value not in (None, "", [], {})


def readable(field: str, value: Any) -> str:
    """A value as the page prints it."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and field.endswith(_TIME_SUFFIXES):
        return _utc(float(value))
    if isinstance(value, int) and field.endswith(_NANOS_SUFFIX):
        return format_usd_money(value)
    if isinstance(value, int | float) and field.endswith(_USD_SUFFIX):
        return format_usd_money(stored_usd_to_nanos(float(value)))
    if isinstance(value, Mapping):
        if not value:
            return NONE
        return ", ".join(f"{k}: {readable(field, v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(readable(field, item) for item in value) if value else NONE
    return str(value)


def _utc(timestamp: float) -> str:
    try:
        return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(timestamp)
