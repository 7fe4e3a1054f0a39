"""HTTP handlers for usage reports. Each takes its dependencies as keyword arguments; the app
binds them (``functools.partial`` keeps them async for Starlette) after its own principal or
admin check, e.g.::

    async def usage_endpoint(request):
        principal = await authenticate(request)
        return await own_usage(request, reports=reports, key_id=principal.key_id)

    Route("/admin/usage", partial(admin_usage, reports=reports))
    Route("/admin/usage/events", partial(admin_usage_events, reports=reports))

Bad parameters get a 400 in OpenAI's error envelope naming the parameter.
"""

from __future__ import annotations

from datetime import date, timedelta

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError, InvalidRequest
from gateway.reports import (
    GROUP_BYS,
    MAX_EVENTS_LIMIT,
    ReportError,
    UsageReports,
    parse_day,
    render_csv,
    validate_key_filter,
)

DEFAULT_RANGE_DAYS = 30
JSON = "application/json"


def json_response(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type=JSON)


def error_response(exc: GatewayError) -> Response:
    return Response(exc.body_bytes(), status_code=exc.status, media_type=JSON, headers=exc.headers)


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer, got {raw!r}", param=name) from None
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}", param=name)
    return value


def default_start(end: date) -> date:
    """The first day of the default range ending at ``end`` (clamped at the calendar's start)."""
    try:
        return end - timedelta(days=DEFAULT_RANGE_DAYS - 1)
    except OverflowError:
        return date.min


def _invalid(exc: ReportError) -> InvalidRequest:
    return InvalidRequest(exc.message, param=exc.param)


async def own_usage(request: Request, *, reports: UsageReports, key_id: str) -> Response:
    """``GET /v1/usage?days=30``: the caller's own key."""
    try:
        days = _int_param(request, "days", DEFAULT_RANGE_DAYS, 1, reports.retention_days)
        return json_response(await reports.usage_for_key(key_id, days))
    except ReportError as exc:
        return error_response(_invalid(exc))
    except GatewayError as exc:
        return error_response(exc)


async def admin_usage(request: Request, *, reports: UsageReports) -> Response:
    """``GET /admin/usage?from=&to=&group_by=&format=json|csv`` (dates inclusive, UTC)."""
    params = request.query_params
    try:
        group_by = params.get("group_by") or "key"
        if group_by not in GROUP_BYS:
            raise InvalidRequest(
                f"group_by must be one of {', '.join(GROUP_BYS)}, got {group_by!r}",
                param="group_by",
            )
        output = params.get("format") or "json"
        if output not in ("json", "csv"):
            raise InvalidRequest(f"format must be json or csv, got {output!r}", param="format")
        end = parse_day(params.get("to"), "to", reports.today())
        start = parse_day(params.get("from"), "from", default_start(end))
        report = await reports.admin_usage(start, end, group_by)
    except ReportError as exc:
        return error_response(_invalid(exc))
    except GatewayError as exc:
        return error_response(exc)
    if output == "csv":
        filename = f"usage-{group_by}-{report['from']}-{report['to']}.csv"
        return Response(
            render_csv(report["data"], group_by),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="{filename}"'},
        )
    return json_response(report)


async def admin_usage_events(request: Request, *, reports: UsageReports) -> Response:
    """``GET /admin/usage/events?key=&model=&cursor=&limit=``: newest first, paginated."""
    params = request.query_params
    try:
        limit = _int_param(request, "limit", 50, 1, MAX_EVENTS_LIMIT)
        key = validate_key_filter(params.get("key"))
        model = params.get("model") or None
        page = await reports.events(key=key, model=model, cursor=params.get("cursor"), limit=limit)
    except ReportError as exc:
        return error_response(_invalid(exc))
    except GatewayError as exc:
        return error_response(exc)
    return json_response(page)
