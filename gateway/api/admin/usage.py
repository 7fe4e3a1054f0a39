"""Usage reports over HTTP: ``GET /v1/usage`` (the calling key's own, ``Guard.API_KEY``) and
``GET /admin/usage``, ``GET /admin/usage/events`` (``Guard.ADMIN``, any role: ``viewer`` is
enough).

They read ``UsageReports`` over the SQL usage store (the same numbers as ``switchyard usage
report``), and every answer says how fresh it is: ``as_of``, ``pending_export`` (events not in
the store yet) and ``export_lag_s`` in JSON, the headers ``x-usage-as-of`` and
``x-usage-pending-export`` with CSV. Bad parameters get a 400 in OpenAI's error envelope naming
the parameter; a store that cannot be read, a 503.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.admins import Actor
from gateway.access.auth import Principal
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import json_response
from gateway.api.payloads import parse_query
from gateway.errors import InvalidRequest
from gateway.metering.reports import (
    GROUP_BYS,
    MAX_EVENTS_LIMIT,
    ReportError,
    render_csv,
    report_range,
    validate_key_filter,
)
from gateway.services import Services

DEFAULT_RANGE_DAYS = 30


class OwnUsageQuery(BaseModel):
    """``GET /v1/usage``; ``days`` is capped by the reports' retention when used."""

    model_config = ConfigDict(extra="forbid")
    days: Annotated[
        int, Field(ge=1, description="at most SWITCHYARD_USAGE_RETENTION_DAYS (default 400)")
    ] = DEFAULT_RANGE_DAYS
    group_by: Literal["tag", "user"] | None = None


DAY_PATTERN = r"^\d{4}-\d{2}-\d{2}$"


class AdminUsageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: Annotated[
        str | None,
        Field(
            alias="from",
            pattern=DAY_PATTERN,
            description="YYYY-MM-DD, UTC; default 30 days before to",
        ),
    ] = None
    to: Annotated[
        str | None, Field(pattern=DAY_PATTERN, description="YYYY-MM-DD, UTC; default today")
    ] = None
    group_by: Literal[GROUP_BYS] = "key"  # type: ignore[valid-type]
    format: Literal["json", "csv"] = "json"


class UsageEventsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: Annotated[str, Field(max_length=200, description="a key id")] | None = None
    model: Annotated[str, Field(max_length=1000)] | None = None
    cursor: Annotated[str, Field(max_length=1000)] | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_EVENTS_LIMIT)] = 50


def _invalid(exc: ReportError) -> InvalidRequest:
    return InvalidRequest(exc.message, param=exc.param)


async def own_usage(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/usage?days=30&group_by=tag|user``: the caller's own key."""
    reports = services.reports
    query = parse_query(OwnUsageQuery, request)
    days = query.days
    if days > reports.retention_days:
        raise InvalidRequest(
            f"days: must be an integer from 1 to {reports.retention_days}", param="days"
        )
    try:
        report = await reports.usage_for_key(principal.key_id, days, query.group_by)
        return json_response(report)
    except ReportError as exc:
        raise _invalid(exc) from None


async def admin_usage(request: Request, services: Services, actor: Actor) -> Response:
    """``GET /admin/usage?from=&to=&group_by=&format=json|csv`` (dates inclusive, UTC)."""
    reports = services.reports
    query = parse_query(AdminUsageQuery, request)
    group_by = query.group_by
    try:
        start, end = report_range(
            query.from_, query.to, today=reports.today(), default_days=DEFAULT_RANGE_DAYS
        )
        report = await reports.admin_usage(start, end, group_by)
    except ReportError as exc:
        raise _invalid(exc) from None
    if query.format == "csv":
        filename = f"usage-{group_by}-{report['from']}-{report['to']}.csv"
        pending = report["pending_export"]
        return Response(
            render_csv(report["data"], group_by),
            media_type="text/csv; charset=utf-8",
            headers={
                "content-disposition": f'attachment; filename="{filename}"',
                "x-usage-as-of": report["as_of"],
                "x-usage-pending-export": "unknown" if pending is None else str(pending),
            },
        )
    return json_response(report)


async def admin_usage_events(request: Request, services: Services, actor: Actor) -> Response:
    """``GET /admin/usage/events?key=&model=&cursor=&limit=``: newest first, paginated."""
    query = parse_query(UsageEventsQuery, request)
    try:
        key = validate_key_filter(query.key)
        page = await services.reports.events(  # an empty filter is no filter
            key=key, model=query.model or None, cursor=query.cursor or None, limit=query.limit
        )
    except ReportError as exc:
        raise _invalid(exc) from None
    return json_response(page)


routes = [
    Route("/v1/usage", endpoint(own_usage, Guard.API_KEY), methods=["GET"]),
    Route("/admin/usage", endpoint(admin_usage, Guard.ADMIN, "viewer"), methods=["GET"]),
    Route(
        "/admin/usage/events",
        endpoint(admin_usage_events, Guard.ADMIN, "viewer"),
        methods=["GET"],
    ),
]
