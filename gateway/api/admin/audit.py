"""The audit log over HTTP: ``record_action`` (every admin handler calls it once its change is
made) and ``GET /admin/audit`` (``admin`` role): entries newest first, filtered by ``actor``
(a token id or name, ``bootstrap``, ``cli:<user>``), ``action``, ``target``, ``from``/``to``
(UTC days, inclusive), paged by ``cursor``; ``format=csv`` for a spreadsheet."""

from __future__ import annotations

import csv
import io
from typing import Annotated, Any, Literal, TypedDict

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.admins import Actor
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import client_address, json_response
from gateway.api.payloads import parse_query
from gateway.audit.trail import AuditEntryView, entry_view
from gateway.errors import InvalidRequest
from gateway.ledger.audit import MAX_AUDIT_LIMIT, AuditQuery, AuditQueryError, days_range_ms
from gateway.ledger.days import parse_days
from gateway.ledger.query import LedgerQueryError
from gateway.server.exchange import request_id_of
from gateway.services import Services

DAY_PATTERN = r"^\d{4}-\d{2}-\d{2}$"
CSV_COLUMNS = (
    "time_ms",
    "event_id",
    "actor_kind",
    "actor_id",
    "actor_name",
    "actor_role",
    "action",
    "target",
    "client",
    "request_id",
    "before",
    "after",
)


class AuditList(TypedDict):
    object: Literal["list"]
    data: list[AuditEntryView]
    next_cursor: str | None


async def record_action(
    services: Services,
    request: Request,
    actor: Actor,
    action: str,
    target: str,
    *,
    before: Any = None,
    after: Any = None,
) -> None:
    """One audit entry for an admin action made over HTTP (durable when this returns)."""
    await services.audit.record(
        actor,
        action,
        target,
        client=client_address(request),
        request_id=request_id_of(request),
        before=before,
        after=after,
    )


class AuditListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    actor: Annotated[str, Field(max_length=200, description="token id or name")] | None = None
    action: Annotated[str, Field(max_length=100, description="e.g. key.rotate")] | None = None
    target: Annotated[str, Field(max_length=300, description="e.g. key:<id>")] | None = None
    from_: Annotated[
        str | None, Field(alias="from", pattern=DAY_PATTERN, description="YYYY-MM-DD, UTC")
    ] = None
    to: Annotated[
        str | None, Field(pattern=DAY_PATTERN, description="YYYY-MM-DD, UTC, inclusive")
    ] = None
    cursor: Annotated[str, Field(max_length=500)] | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_AUDIT_LIMIT)] = 100
    format: Literal["json", "csv"] = "json"


def audit_query(query: AuditListQuery) -> AuditQuery:
    """The list query as the store's (an empty filter is no filter)."""
    try:
        start_ms, end_ms = days_range_ms(*parse_days(query.from_, query.to))
    except LedgerQueryError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    try:
        return AuditQuery(
            actor=query.actor or None,
            action=query.action or None,
            target=query.target or None,
            start_ms=start_ms,
            end_ms=end_ms,
            cursor=query.cursor or None,
            limit=query.limit,
        )
    except AuditQueryError as exc:
        raise InvalidRequest(f"{exc.param}: {exc.message}", param=exc.param) from None


def render_csv(entries: list[AuditEntryView]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for entry in entries:
        row = []
        for column in CSV_COLUMNS:
            value = entry[column]
            if column in ("before", "after"):
                value = "" if value is None else _json_text(value)
            row.append(_csv_safe(value))
        writer.writerow(row)
    return out.getvalue()


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _csv_safe(value: Any) -> Any:
    """A cell a spreadsheet will not run as a formula."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


async def list_audit(request: Request, services: Services, actor: Actor) -> Response:
    query = parse_query(AuditListQuery, request)
    page = await services.audit.query(audit_query(query))
    entries = [entry_view(entry) for entry in page.entries]
    if query.format == "csv":
        return Response(
            render_csv(entries),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": 'attachment; filename="audit.csv"'},
        )
    return json_response(AuditList(object="list", data=entries, next_cursor=page.next_cursor))


routes = [Route("/admin/audit", endpoint(list_audit, Guard.ADMIN, "admin"), methods=["GET"])]
