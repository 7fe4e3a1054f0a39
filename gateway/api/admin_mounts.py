"""Handlers written elsewhere (usage reports, policy admin), mounted behind the gateway's auth.

The usage and policy modules keep their handlers free of auth and app state; here each one gets
the admin check (``/admin/*``) or the caller's own key (``/v1/usage``) and its dependencies
from the app's services at request time.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.admin import admin_endpoint
from gateway.api.http import error_response
from gateway.api.policy_admin import explain_route, get_policy, put_policy, validate_policy
from gateway.api.services import Services
from gateway.api.usage_api import admin_usage, admin_usage_events, own_usage
from gateway.errors import GatewayError
from gateway.server.exchange import request_id_of


async def usage_of_own_key(request: Request) -> Response:
    """``GET /v1/usage``: the calling key's own usage."""
    services: Services = request.app.state.services
    headers = {"x-request-id": request_id_of(request)}
    try:
        principal = await services.auth.authenticate(request.headers.get("authorization"))
    except GatewayError as exc:
        return error_response(exc, headers)
    response = await own_usage(request, reports=services.reports, key_id=principal.key_id)
    response.headers.update(headers)
    return response


async def _admin_usage(request: Request, services: Services) -> Response:
    return await admin_usage(request, reports=services.reports)


async def _admin_usage_events(request: Request, services: Services) -> Response:
    return await admin_usage_events(request, reports=services.reports)


async def _get_policy(request: Request, services: Services) -> Response:
    return await get_policy(request, services.policies)


async def _put_policy(request: Request, services: Services) -> Response:
    return await put_policy(request, services.policies)


async def _validate_policy(request: Request, services: Services) -> Response:
    return await validate_policy(request, services.policies)


async def _explain_route(request: Request, services: Services) -> Response:
    return await explain_route(request, services.router, services.dispatcher)


routes = [
    Route("/v1/usage", usage_of_own_key, methods=["GET"]),
    Route("/admin/usage", admin_endpoint(_admin_usage), methods=["GET"]),
    Route("/admin/usage/events", admin_endpoint(_admin_usage_events), methods=["GET"]),
    Route("/admin/policy", admin_endpoint(_get_policy), methods=["GET"]),
    Route("/admin/policy", admin_endpoint(_put_policy), methods=["PUT"]),
    Route("/admin/policy/validate", admin_endpoint(_validate_policy), methods=["POST"]),
    Route("/admin/route/explain", admin_endpoint(_explain_route), methods=["POST"]),
]
