"""The admin dashboard (gateway/dashboard.py) mounted with the app's reports, keys and auth.

Sessions live in Redis (``gateway.dashboard_sessions``); the login checks the admin key with the
same constant-time comparison as the admin API, and its failures count towards the same
per-address throttle as failed admin bearers.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.services import Services
from gateway.auth_throttle import AuthThrottle
from gateway.dashboard import (
    DashboardAuth,
    dashboard_login,
    dashboard_logout,
    dashboard_page,
)
from gateway.dashboard_sessions import SessionStore
from gateway.redis_connect import RedisClient

MAX_KEYS_SHOWN = 1000


SESSION_TTL_S = 8 * 3600


def build_dashboard_auth(
    admin_key: str, redis: RedisClient, *, secure_cookie: bool, throttle: AuthThrottle
) -> DashboardAuth:
    def verify(token: str) -> bool:
        return hmac.compare_digest(token.encode(), admin_key.encode())

    return DashboardAuth(
        verify_admin_key=verify,
        sessions=SessionStore(redis, admin_key, SESSION_TTL_S),
        secure_cookie=secure_cookie,
        throttle=throttle,
    )


async def _key_views(services: Services) -> Sequence[Mapping[str, Any]]:
    page = await services.keys.list(limit=MAX_KEYS_SHOWN)
    return [record.public_view() for record in page.records]


async def _page(request: Request) -> Response:
    services: Services = request.app.state.services
    return await dashboard_page(
        request,
        reports=services.reports,
        auth=services.dashboard_auth,
        list_keys=lambda: _key_views(services),
        renderer=services.dashboard_renderer,
    )


async def _login(request: Request) -> Response:
    services: Services = request.app.state.services
    return await dashboard_login(
        request, auth=services.dashboard_auth, renderer=services.dashboard_renderer
    )


async def _logout(request: Request) -> Response:
    services: Services = request.app.state.services
    return await dashboard_logout(
        request, auth=services.dashboard_auth, renderer=services.dashboard_renderer
    )


routes = [
    Route("/admin/ui", _page, methods=["GET"]),
    Route("/admin/ui/login", _login, methods=["POST"]),
    Route("/admin/ui/logout", _logout, methods=["POST"]),
]
