"""The dashboard's batches page, ``GET /admin/ui/batches`` (any role): every key's batches,
newest first, with their status, request counts and what they cost at the batch prices over
the last 30 days (``/admin/usage?group_by=batch``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from gateway.api.dashboard.forms import page_session
from gateway.api.endpoint import Guard, endpoint
from gateway.api.pages import secured
from gateway.batches.records import BatchRecord, LineCounts
from gateway.money import format_usd_money
from gateway.services import Services

SHOWN = 100
COST_DAYS = 30


def batch_row(record: BatchRecord, counts: LineCounts, cost_nanos: int | None) -> dict[str, Any]:
    created = datetime.fromtimestamp(record.created_ms / 1000, UTC)
    return {
        "id": record.batch_id,
        "api": record.api,
        "key_id": record.key_id,
        "endpoint": record.endpoint,
        "status": record.status,
        "total": counts.total,
        "completed": counts.completed,
        "failed": counts.failed,
        "unanswered": counts.cancelled + counts.expired,
        "created": created.strftime("%Y-%m-%d %H:%M:%S"),
        "created_iso": created.isoformat(timespec="seconds"),
        "cost": format_usd_money(cost_nanos) if cost_nanos is not None else "—",
    }


async def batches_page(request: Request, services: Services) -> Response:
    """``GET /admin/ui/batches``"""
    session = await page_session(request, services, "viewer")
    if isinstance(session, Response):
        return session
    store, reports = services.batches.store, services.reports
    page = await store.batches(None, api=None, after=None, limit=SHOWN)
    today = reports.today()
    report = await reports.admin_usage(today - timedelta(days=COST_DAYS - 1), today, "batch")
    costs = {row["batch"]: row["cost_nanos"] for row in report["data"]}
    rows = [
        batch_row(record, await store.counts(record.batch_id), costs.get(record.batch_id))
        for record in page.items
    ]
    html = services.pages.render(
        "batches.html", session=session, active="batches", batches=rows, more=page.has_more
    )
    return secured(HTMLResponse(html))


routes = [Route("/admin/ui/batches", endpoint(batches_page, Guard.DASHBOARD), methods=["GET"])]
