"""The ``/admin/ui`` dashboard over HTTP (``Guard.DASHBOARD``): the page, login and logout.

Login posts the admin key once, checked with the same constant-time comparison as the admin
API; the answer is an HttpOnly, SameSite=Strict, Secure (unless configured off) cookie holding
a random session token, never the key. Sessions live server-side (``gateway.access.sessions``):
logout ends one, an admin key change ends them all. Failed logins count towards the same
per-address throttle as failed admin bearers. A Redis outage is a 503 page (``Retry-After``),
as the admin API answers it with a 503 envelope. What the page shows is ``dashboard_view``'s.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.access.auth import is_admin_key
from gateway.api.dashboard_view import build_view, error_page, login_page, secured
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import client_address
from gateway.errors import RateLimited
from gateway.metering.reports import ReportError, parse_day
from gateway.services import Services

COOKIE_NAME = "sy_admin_session"
DEFAULT_DAYS = 14
MAX_LOGIN_BODY = 4096
MAX_KEYS_SHOWN = 1000


async def page(request: Request, services: Services) -> Response:
    """``GET /admin/ui?from=&to=``: the dashboard, or the login form without a session."""
    renderer, reports = services.pages, services.reports
    if not await services.sessions.valid(request.cookies.get(COOKIE_NAME)):
        return login_page(renderer, None, 401)
    try:
        end = parse_day(request.query_params.get("to"), "to", reports.today())
        start = parse_day(
            request.query_params.get("from"), "from", end - timedelta(days=DEFAULT_DAYS - 1)
        )
        reports.check_range(start, end)
    except ReportError as exc:
        return error_page(renderer, exc.message, 400, exc.param)
    keys = await services.keys.list(limit=MAX_KEYS_SHOWN)
    key_list: list[dict[str, Any]] = [record.public_view() for record in keys.records]
    view = build_view(start, end, await reports.cells(start, end), key_list)
    freshness = await reports.freshness()
    return secured(HTMLResponse(renderer.render("dashboard.html", view=view, freshness=freshness)))


async def login(request: Request, services: Services) -> Response:
    """``POST /admin/ui/login`` with form field ``key``: sets the session cookie."""
    renderer = services.pages
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != "application/x-www-form-urlencoded":
        return login_page(renderer, "The login form must be posted as a form.", 400)
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_LOGIN_BODY:
            return login_page(renderer, "The login form is too large.", 413)
    key = parse_qs(body.decode("utf-8", "replace")).get("key", [""])[0].strip()
    if not key:
        return login_page(renderer, "Enter the admin key.", 400)
    address = client_address(request)
    try:
        await services.auth_throttle.check(address)
        if not is_admin_key(key, services.admin_key):
            await services.auth_throttle.failed(address, "dashboard_login")
            return login_page(renderer, "That is not the admin key.", 401)
        token = await services.sessions.create()
    except RateLimited as refused:
        refusal = login_page(renderer, refused.message, 429)
        refusal.headers.update(refused.headers)
        return refusal
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
    """``POST /admin/ui/logout``: ends the session (server-side) and forgets the cookie."""
    await services.sessions.end(request.cookies.get(COOKIE_NAME))
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
