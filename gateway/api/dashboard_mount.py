"""The admin dashboard (gateway/dashboard.py) mounted with the app's reports, keys and auth.

Sessions live in Redis (``gateway.access.sessions``); the login checks the admin key with the
same constant-time comparison as the admin API, and its failures count towards the same
per-address throttle as failed admin bearers. Every dashboard route answers a Redis outage with
a 503 page (``Retry-After``), as the admin API answers it with a 503 envelope.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.sessions import SessionStore
from gateway.access.throttle import AuthThrottle
from gateway.api.services import Services
from gateway.dashboard import (
    DashboardAuth,
    dashboard_login,
    dashboard_logout,
    dashboard_page,
    error_page,
)
from gateway.store.connect import REDIS_FAILURES, RedisClient

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


def _unless_redis_down(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        services: Services = request.app.state.services
        try:
            return await handler(request)
        except REDIS_FAILURES as exc:
            services.log.warning(
                "dashboard_store_unavailable", path=request.url.path, error=type(exc).__name__
            )
            response = error_page(
                services.dashboard_renderer,
                "The usage store (Redis) is unavailable right now; try again in a moment.",
                503,
            )
            response.headers["retry-after"] = "5"
            return response

    endpoint.__name__ = handler.__name__
    return endpoint


routes = [
    Route("/admin/ui", _unless_redis_down(_page), methods=["GET"]),
    Route("/admin/ui/login", _unless_redis_down(_login), methods=["POST"]),
    Route("/admin/ui/logout", _unless_redis_down(_logout), methods=["POST"]),
]
