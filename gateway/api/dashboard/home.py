"""The ``/admin/ui`` dashboard over HTTP (``Guard.DASHBOARD``): the usage page, login, logout.

Login posts the bootstrap admin key or a named admin token once, checked as the admin API
checks it (``access/admins.py``); the answer is an HttpOnly, SameSite=Strict, Secure (unless
configured off) cookie holding a random session token, never the credential. Sessions live
server-side (``gateway.access.sessions``): logout ends one, an admin key change or a token's
revocation ends theirs. Failed logins count towards the same per-address throttle as failed
admin bearers. Logins and logouts are in the audit log. Every role sees the usage page; the
keys and teams page (``manage.py``) needs ``operator``, the audit page ``admin``.
Every form carries a CSRF token (``forms.py``). A Redis outage is a 503 page
(``Retry-After``), as the admin API answers it with a 503 envelope.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.api.admin.audit import record_action
from gateway.api.dashboard.forms import (
    COOKIE_NAME,
    CSRF_REFUSED,
    FormRefused,
    login_csrf_matches,
    login_form,
    page_session,
    posted,
    read_form,
)
from gateway.api.dashboard.view import USAGE_PAGE, build_view
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import client_address
from gateway.api.pages import error_page, secured
from gateway.errors import RateLimited
from gateway.metering.reports import ReportError, report_range
from gateway.services import Services

DEFAULT_DAYS = 14
MAX_KEYS_SHOWN = 1000


async def page(request: Request, services: Services) -> Response:
    """``GET /admin/ui?from=&to=``: the usage dashboard, or the login form without a session."""
    renderer, reports = services.pages, services.reports
    session = await page_session(request, services, "viewer")
    if isinstance(session, Response):
        return session
    try:
        start, end = report_range(
            request.query_params.get("from"),
            request.query_params.get("to"),
            today=reports.today(),
            default_days=DEFAULT_DAYS,
        )
        reports.check_range(start, end)
    except ReportError as exc:
        return error_page(renderer, exc.message, 400, exc.param, USAGE_PAGE)
    keys = await services.keys.list(limit=MAX_KEYS_SHOWN)
    key_list: list[dict[str, Any]] = [record.public_view() for record in keys.records]
    view = build_view(
        start,
        end,
        await reports.cells(start, end),
        key_list,
        by_tag=await reports.grouped(start, end, "tag"),
        by_user=await reports.grouped(start, end, "user"),
    )
    freshness = await reports.freshness()
    html = renderer.render(
        "dashboard.html", view=view, session=session, active="usage", freshness=freshness
    )
    return secured(HTMLResponse(html))


async def login(request: Request, services: Services) -> Response:
    """``POST /admin/ui/login`` with form fields ``key`` (the admin key or an admin token)
    and ``csrf``: sets the session cookie."""
    try:
        form = await read_form(request, services)
    except FormRefused as refused:
        return refused.response
    if not login_csrf_matches(request, form):
        return login_form(services, CSRF_REFUSED, 403)
    credential = form.get("key", "")
    if not credential:
        return login_form(services, "Enter the admin key or an admin token.", 400)
    address = client_address(request)
    try:
        await services.auth_throttle.check(address)
        actor = await services.admins.resolve(credential)
        if actor is None:
            await services.auth_throttle.failed(address, "dashboard_login")
            return login_form(services, "That is not the admin key or an admin token.", 401)
        token = await services.sessions.create(actor)
    except RateLimited as refused:
        refusal = login_form(services, refused.message, 429)
        refusal.headers.update(refused.headers)
        return refusal
    await record_action(services, request, actor, "dashboard.login", "dashboard")
    response = RedirectResponse("/admin/ui", status_code=303)
    response.set_cookie(
        COOKIE_NAME,
        token,
        max_age=services.sessions.ttl_s,
        path="/admin",
        httponly=True,
        samesite="strict",
        secure=services.settings.dashboard_cookie_secure,
    )
    return secured(response)


async def logout(request: Request, services: Services) -> Response:
    """``POST /admin/ui/logout`` (form field ``csrf``): ends the session (server-side) and
    forgets the cookie."""
    checked = await posted(request, services, "viewer")
    if isinstance(checked, Response):
        return checked
    session, _ = checked
    await services.sessions.end(request.cookies.get(COOKIE_NAME))
    await record_action(services, request, session.actor, "dashboard.logout", "dashboard")
    response = RedirectResponse("/admin/ui", status_code=303)
    response.delete_cookie(
        COOKIE_NAME,
        path="/admin",
        httponly=True,
        samesite="strict",
        secure=services.settings.dashboard_cookie_secure,
    )
    return secured(response)


routes = [
    Route("/admin/ui", endpoint(page, Guard.DASHBOARD), methods=["GET"]),
    Route("/admin/ui/login", endpoint(login, Guard.DASHBOARD), methods=["POST"]),
    Route("/admin/ui/logout", endpoint(logout, Guard.DASHBOARD), methods=["POST"]),
]
