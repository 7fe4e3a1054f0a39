"""The one way a route is wired: ``Route(path, endpoint(handler, Guard.X), methods=[...])``
(``admin_routes`` writes those of one admin path, a handler per method; ``v1/pipeline.py``'s
``door_route`` the ``POST`` of a /v1 door).

Every handler is ``async def handler(request, services) -> Response``; behind ``Guard.API_KEY``
it also gets the caller's ``Principal``. ``endpoint`` takes the services from the lifespan
state (nothing reads ``app.state``), applies the guard, turns a ``GatewayError`` into its
envelope and a Redis outage into a 503, and sends the request id back as ``x-request-id``:

- ``Guard.NONE``: the handler speaks for itself. /v1 pipelines authenticate as one of their
  stages (their errors are in the client's format, their access line is their own), and the
  probes need no credentials;
- ``Guard.API_KEY``: the caller's own API key (``GET /v1/usage``);
- ``Guard.ADMIN``: an admin credential as a bearer (the bootstrap admin key, compared in
  constant time, or a named admin token, ``access/admins.py``) whose role reaches the ``role``
  the route declares (``viewer`` < ``operator`` < ``admin``): none → 401, an unknown or revoked
  one → 403, counted per client address and 429 once that address failed too often; a known
  one whose role is too low → 403 ``insufficient_role`` (not counted). The handler also gets
  the ``Actor``; one ``admin_request`` log line says who, with the status the client got;
- ``Guard.DASHBOARD``: the dashboard's HTML pages, whose session cookie is the page's own
  business; a Redis outage is the 503 error page.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.admins import Actor, Role
from gateway.access.auth import Principal, admin_token, client_credential
from gateway.api.http import client_address, error_response
from gateway.api.pages import error_page
from gateway.errors import GatewayError, PermissionDenied, ServiceUnavailable
from gateway.server.exchange import REQUEST_ID_HEADER, request_id_of, when_answered
from gateway.services import Services
from gateway.store.connect import REDIS_FAILURES

Endpoint = Callable[[Request], Awaitable[Response]]
_LOGGED_PATH_CHARS = 200


class Guard(enum.Enum):
    NONE = "none"
    API_KEY = "api_key"
    ADMIN = "admin"
    DASHBOARD = "dashboard"


def services_of(request: Request) -> Services:
    """The services the lifespan yielded, as the server copies them into each request's scope
    (read there: ``request.state`` builds a ``State`` and reaches the value through two
    failed attribute lookups, about 1 µs)."""
    return request.scope["state"]["services"]


def endpoint(
    handler: Callable[..., Awaitable[Response]], guard: Guard, role: Role | None = None
) -> Endpoint:
    """``handler`` behind ``guard``, as a Starlette endpoint; an admin route names the ``role``
    it needs."""
    if (guard is Guard.ADMIN) != (role is not None):
        raise ValueError("an admin route, and only an admin route, declares the role it needs")
    match guard:
        case Guard.NONE:
            wrapped = _open(handler)
        case Guard.API_KEY:
            wrapped = _api_key(handler)
        case Guard.ADMIN:
            assert role is not None
            wrapped = _admin(handler, role)
        case Guard.DASHBOARD:
            wrapped = _dashboard(handler)
    wrapped.__name__ = handler.__name__  # what Starlette names the route after
    wrapped.__doc__ = handler.__doc__
    return wrapped


def admin_routes(
    path: str, role: Role, **handlers: Callable[..., Awaitable[Response]]
) -> list[Route]:
    """The routes of one admin ``path``, a handler per method (``GET=list_keys``), each behind
    ``Guard.ADMIN`` for ``role``."""
    return [
        Route(path, endpoint(handler, Guard.ADMIN, role), methods=[method])
        for method, handler in handlers.items()
    ]


def _open(handler: Callable[..., Awaitable[Response]]) -> Endpoint:
    async def call(request: Request) -> Response:
        response = await handler(request, services_of(request))
        response.headers[REQUEST_ID_HEADER] = request_id_of(request)
        return response

    return call


def _api_key(handler: Callable[..., Awaitable[Response]]) -> Endpoint:
    async def call(request: Request) -> Response:
        services = services_of(request)

        async def guarded() -> Response:
            credential = client_credential(request.headers)
            principal: Principal = await services.auth.authenticate(credential)
            return await handler(request, services, principal)

        response = await _enveloped(guarded)
        response.headers[REQUEST_ID_HEADER] = request_id_of(request)
        return response

    return call


def _admin(handler: Callable[..., Awaitable[Response]], role: Role) -> Endpoint:
    async def call(request: Request) -> Response:
        services = services_of(request)
        request_id = request_id_of(request)
        started = time.perf_counter()
        who: list[Actor] = []

        def log_line(status: int) -> None:  # with the status the client got
            services.log.info(
                "admin_request",
                request_id=request_id,
                method=request.method,
                path=request.url.path[:_LOGGED_PATH_CHARS],
                status=status,
                actor=who[0].id if who else None,
                latency_ms=round((time.perf_counter() - started) * 1000, 3),
            )

        async def guarded() -> Response:
            actor = await _check_admin(request, services, role)
            who.append(actor)
            return await handler(request, services, actor)

        try:
            response = await _enveloped(guarded)
        except Exception:  # the exchange middleware answers 500 (or 499: the client left)
            when_answered(request, log_line, 500)
            raise
        response.headers[REQUEST_ID_HEADER] = request_id
        when_answered(request, log_line, response.status_code)
        return response

    return call


def _dashboard(handler: Callable[..., Awaitable[Response]]) -> Endpoint:
    async def call(request: Request) -> Response:
        services = services_of(request)
        try:
            response = await handler(request, services)
        except (*REDIS_FAILURES, ServiceUnavailable) as exc:
            services.log.warning(
                "dashboard_store_unavailable", path=request.url.path, error=type(exc).__name__
            )
            response = error_page(
                services.pages,
                "Redis or the usage store is unavailable right now; try again in a moment.",
                503,
            )
            response.headers["retry-after"] = "5"
        response.headers[REQUEST_ID_HEADER] = request_id_of(request)
        return response

    return call


async def _check_admin(request: Request, services: Services, role: Role) -> Actor:
    """401 without a bearer; 403 for a wrong one (counted against the client's address, and
    logged with it); 429 while that address has failed too often, even with the right key;
    403 ``insufficient_role`` for a valid credential whose role is below ``role``."""
    token = admin_token(request.headers.get("authorization"))
    address = client_address(request)
    await services.auth_throttle.check(address)
    actor = await services.admins.resolve(token)
    if actor is None:
        await services.auth_throttle.failed(address, "admin_bearer")
        raise PermissionDenied(
            "This endpoint needs the admin key or an admin token.", code="admin_key_required"
        )
    if not actor.may(role):
        raise PermissionDenied(
            f"This endpoint needs the {role} role; this credential has the {actor.role} role.",
            code="insufficient_role",
        )
    return actor


async def _enveloped(call: Callable[[], Awaitable[Response]]) -> Response:
    """``call``'s answer; a ``GatewayError`` as its envelope, a Redis outage as a 503 one."""
    try:
        return await call()
    except GatewayError as exc:
        return error_response(exc)
    except REDIS_FAILURES as exc:
        unavailable = f"the key store is unavailable ({type(exc).__name__})"
        return error_response(ServiceUnavailable(unavailable))
