"""The admin dashboard (gateway/dashboard.py) mounted with the app's reports, keys and auth.

The dashboard signs its own session cookie; its login checks the admin key with the same
constant-time comparison as the admin API.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.services import Services
from gateway.dashboard import (
    DashboardAuth,
    dashboard_login,
    dashboard_logout,
    dashboard_page,
)

MAX_KEYS_SHOWN = 1000


def build_dashboard_auth(admin_key: str, pepper: bytes) -> DashboardAuth:
    # Derived from the pepper: stable across restarts and replicas, never the admin key itself.
    session_secret = hmac.new(pepper, b"switchyard dashboard session", hashlib.sha256).digest()

    def verify(token: str) -> bool:
        return hmac.compare_digest(token.encode(), admin_key.encode())

    return DashboardAuth(verify_admin_key=verify, session_secret=session_secret)


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
    return await dashboard_logout(request, auth=services.dashboard_auth)


routes = [
    Route("/admin/ui", _page, methods=["GET"]),
    Route("/admin/ui/login", _login, methods=["POST"]),
    Route("/admin/ui/logout", _logout, methods=["POST"]),
]
