"""Admin API for keys: create, list, show, update, rotate (with grace), revoke.

Every endpoint needs ``Authorization: Bearer <admin key>`` (compared in constant time): none
→ 401, any other key → 403, and past ``SWITCHYARD_AUTH_FAILURE_LIMIT`` wrong ones from one
address → 429 for the rest of the window (``gateway.access.throttle``). The operations
themselves are ``gateway.access.key_admin``'s, shared with the CLI: payloads are strict (an
unknown or malformed field is a 400 that names it), and secrets appear only in the create and
rotate responses, never in a log.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access import key_admin
from gateway.access.auth import admin_token, is_admin_key
from gateway.access.key_models import KeyListQuery
from gateway.access.keys import KeyRecord
from gateway.api.http import client_address, error_response, json_response, read_json_object
from gateway.api.payloads import parse_query
from gateway.api.services import Services
from gateway.errors import GatewayError, PermissionDenied, ServiceUnavailable
from gateway.routing.policy import Policy
from gateway.server.exchange import request_id_of, when_answered
from gateway.store.connect import REDIS_FAILURES

MAX_KEY_BODY_BYTES = 65536


def _policy(services: Services) -> Policy | None:
    return services.policies.current.policy if services.policies.loaded else None


def _key_id(request: Request) -> str:
    return key_admin.checked_key_id(request.path_params["key_id"])


def _view(record: KeyRecord) -> dict[str, Any]:
    return record.public_view()


Handler = Callable[[Request, Services], Awaitable[Response]]


async def _check_admin(request: Request, services: Services) -> None:
    """401 without a bearer; 403 for a wrong one (counted against the client's address, and
    logged with it); 429 while that address has failed too often, even with the right key."""
    token = admin_token(request.headers.get("authorization"))
    address = client_address(request)
    await services.auth_throttle.check(address)
    if not is_admin_key(token, services.admin_key):
        await services.auth_throttle.failed(address, "admin_bearer")
        raise PermissionDenied("This endpoint needs the admin key.", code="admin_key_required")


def admin_endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Admin auth, the error envelope, request id and one log line around ``handler``."""

    async def endpoint(request: Request) -> Response:
        services: Services = request.app.state.services
        request_id = request_id_of(request)
        started = time.perf_counter()

        def log_line(status: int) -> None:  # with the status the client got
            services.log.info(
                "admin_request",
                request_id=request_id,
                method=request.method,
                path=request.url.path[:200],
                status=status,
                latency_ms=round((time.perf_counter() - started) * 1000, 3),
            )

        try:
            await _check_admin(request, services)
            response = await handler(request, services)
        except GatewayError as exc:
            response = error_response(exc)
        except REDIS_FAILURES as exc:
            response = error_response(
                ServiceUnavailable(f"the key store is unavailable ({type(exc).__name__})")
            )
        except Exception:  # the exchange middleware answers 500 (or 499: the client left)
            when_answered(request, log_line, 500)
            raise
        response.headers["x-request-id"] = request_id
        when_answered(request, log_line, response.status_code)
        return response

    return endpoint


async def create_key(request: Request, services: Services) -> Response:
    data = await read_json_object(request, MAX_KEY_BODY_BYTES)
    created = await key_admin.create_key(services.keys, data, _policy(services))
    return json_response({**_view(created.record), "key": created.key}, status=201)


async def list_keys(request: Request, services: Services) -> Response:
    page = await key_admin.list_keys(services.keys, parse_query(KeyListQuery, request))
    data = [_view(record) for record in page.records]
    return json_response(
        {
            "object": "list",
            "data": data,
            "has_more": page.has_more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


async def get_key(request: Request, services: Services) -> Response:
    return json_response(_view(await key_admin.show_key(services.keys, _key_id(request))))


async def update_key(request: Request, services: Services) -> Response:
    key_id = _key_id(request)
    data = await read_json_object(request, MAX_KEY_BODY_BYTES)
    record = await key_admin.update_key(services.keys, key_id, data, _policy(services))
    services.auth.invalidate(key_id)
    return json_response(_view(record))


async def rotate_key(request: Request, services: Services) -> Response:
    key_id = _key_id(request)
    raw = await request.body()  # an empty body means the defaults
    data = await read_json_object(request, MAX_KEY_BODY_BYTES) if raw.strip() else {}
    idempotency_key = request.headers.get("idempotency-key")
    created = await key_admin.rotate_key(services.keys, key_id, data, idempotency_key)
    services.auth.invalidate(key_id)
    return json_response({**_view(created.record), "key": created.key})


async def revoke_key(request: Request, services: Services) -> Response:
    key_id = _key_id(request)
    record = await key_admin.revoke_key(services.keys, key_id)
    services.auth.invalidate(key_id)
    return json_response(_view(record))


routes = [
    Route("/admin/keys", admin_endpoint(create_key), methods=["POST"]),
    Route("/admin/keys", admin_endpoint(list_keys), methods=["GET"]),
    Route("/admin/keys/{key_id}", admin_endpoint(get_key), methods=["GET"]),
    Route("/admin/keys/{key_id}", admin_endpoint(update_key), methods=["PATCH"]),
    Route("/admin/keys/{key_id}/rotate", admin_endpoint(rotate_key), methods=["POST"]),
    Route("/admin/keys/{key_id}/revoke", admin_endpoint(revoke_key), methods=["POST"]),
]
