"""Admin API for keys: create, list, show, update, rotate (with grace), revoke.

Every endpoint needs ``Authorization: Bearer <admin key>`` (compared in constant time): none
→ 401, any other key → 403, and past ``SWITCHYARD_AUTH_FAILURE_LIMIT`` wrong ones from one
address → 429 for the rest of the window (``gateway.auth_throttle``). Payloads are strict: an unknown or malformed field is a 400 that
names it. Secrets appear only in the create and rotate responses, never in a log.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.http import (
    client_address,
    error_response,
    json_response,
    read_json_object,
)
from gateway.api.payloads import parse_payload, parse_query
from gateway.api.services import Services
from gateway.auth import admin_token, is_admin_key
from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ServiceUnavailable,
    echo,
)
from gateway.keys import ID_LENGTH, KeyRecord
from gateway.money import MAX_BUDGET_USD, usd_to_nanos
from gateway.routing.policy import Policy
from gateway.server.exchange import request_id_of, when_answered
from gateway.store.connect import REDIS_FAILURES

MAX_METADATA_BYTES = 4096
MAX_GRACE_S = 30 * 24 * 3600
Name = Annotated[StrictStr, Field(min_length=1, max_length=200)]
Rpm = Annotated[StrictInt, Field(ge=0, le=10_000_000)]
Tpm = Annotated[StrictInt, Field(ge=0, le=10_000_000_000)]
# USD, exact to the nano-dollar, and small enough that the limiter's Lua doubles stay exact.
Budget = Annotated[StrictFloat | StrictInt, Field(ge=0, le=MAX_BUDGET_USD, allow_inf_nan=False)]
MetadataValue = StrictStr | StrictInt | StrictFloat | bool | None


def _timestamp(value: Any) -> float | None:
    """``expires_at`` as epoch seconds: a number, or an ISO 8601 string (UTC if no zone)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("must be a unix timestamp or an ISO 8601 date-time")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            raise ValueError("must be a positive unix timestamp")
        return float(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return _timestamp(float(value))
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("must be a unix timestamp or an ISO 8601 date-time") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    raise ValueError("must be a unix timestamp or an ISO 8601 date-time")


class _KeyFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    team: Name | None = None
    models: Annotated[list[Name], Field(max_length=1000)] | None = None
    rpm: Rpm | None = None
    tpm: Tpm | None = None
    budget_usd: Budget | None = None
    budget_period: Literal["day", "month", "total"] | None = None
    expires_at: Any = None
    metadata: dict[Annotated[str, Field(max_length=100)], MetadataValue] | None = None

    @field_validator("expires_at", mode="before")
    @classmethod
    def _expiry(cls, value: Any) -> float | None:
        return _timestamp(value)

    @field_validator("budget_usd")
    @classmethod
    def _exact_budget(cls, value: float | None) -> float | None:
        if value is None:
            return None
        usd_to_nanos(value)  # at most 9 decimal places, or a 400 naming budget_usd
        return float(value)

    @field_validator("metadata")
    @classmethod
    def _small_metadata(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and len(orjson.dumps(value)) > MAX_METADATA_BYTES:
            raise ValueError(f"must serialize to at most {MAX_METADATA_BYTES} bytes")
        return value


class KeyCreate(_KeyFields):
    pass


class KeyUpdate(_KeyFields):
    pass


class RotateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grace_seconds: Annotated[StrictInt | StrictFloat, Field(ge=0, le=MAX_GRACE_S)] = 0


class KeyListQuery(BaseModel):
    """``GET /admin/keys`` query parameters."""

    model_config = ConfigDict(extra="forbid")
    limit: Annotated[int, Field(ge=1, le=1000)] = 50
    after: Annotated[str, Field(max_length=200)] | None = None
    team: Annotated[str, Field(max_length=200)] | None = None
    status: Literal["active", "revoked", "expired"] | None = None


def check_models(policy: Policy | None, models: list[str] | None) -> None:
    """Every allow-list entry must be a model or alias of the policy in force."""
    if models is None or policy is None:
        return
    for index, name in enumerate(models):
        if policy.resolve_model(name) is None:
            raise InvalidRequest(
                f"models[{index}]: unknown model or alias {name!r}", param=f"models[{index}]"
            )


def _policy(services: Services) -> Policy | None:
    return services.policies.current.policy if services.policies.loaded else None


def _key_id(request: Request) -> str:
    key_id = request.path_params["key_id"]
    if len(key_id) != ID_LENGTH or not (key_id.isascii() and key_id.isalnum()):
        raise NotFound(f"no key with id {echo(key_id)}", param="id")
    return key_id


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
    payload: KeyCreate = parse_payload(KeyCreate, await read_json_object(request, 65536))
    check_models(_policy(services), payload.models)
    fields = payload.model_dump()
    if fields["expires_at"] is not None and fields["expires_at"] <= time.time():
        raise InvalidRequest("expires_at: must be in the future", param="expires_at")
    if fields["budget_usd"] is not None and fields["budget_period"] is None:
        fields["budget_period"] = "month"
    if fields["metadata"] is None:
        fields["metadata"] = {}
    created = await services.keys.create(fields)
    return json_response({**_view(created.record), "key": created.key}, status=201)


async def list_keys(request: Request, services: Services) -> Response:
    query = parse_query(KeyListQuery, request)
    try:
        page = await services.keys.list(  # an empty filter is no filter
            limit=query.limit,
            after=query.after or None,
            team=query.team or None,
            status=query.status,
        )
    except KeyError:
        raise InvalidRequest("after: no key with that id", param="after") from None
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
    key_id = _key_id(request)
    record = await services.keys.get(key_id)
    if record is None:
        raise NotFound(f"no key with id {key_id!r}", param="id")
    return json_response(_view(record))


async def update_key(request: Request, services: Services) -> Response:
    key_id = _key_id(request)
    data = await read_json_object(request, 65536)
    payload: KeyUpdate = parse_payload(KeyUpdate, data)
    check_models(_policy(services), payload.models)
    # Only the fields sent change; an explicit null clears a limit or expiry.
    changes = {name: getattr(payload, name) for name in data}
    if changes.get("metadata") is None and "metadata" in changes:
        changes["metadata"] = {}
    record = await services.keys.update(key_id, changes)
    if record is None:
        raise NotFound(f"no key with id {key_id!r}", param="id")
    services.auth.invalidate(key_id)
    return json_response(_view(record))


async def rotate_key(request: Request, services: Services) -> Response:
    key_id = _key_id(request)
    raw = await request.body()  # an empty body means the defaults
    data = await read_json_object(request, 65536) if raw.strip() else {}
    payload: RotateRequest = parse_payload(RotateRequest, data)
    idempotency_key = request.headers.get("idempotency-key")
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
        raise InvalidRequest("Idempotency-Key must be 1 to 200 characters", param="Idempotency-Key")
    outcome = await services.keys.rotate(key_id, float(payload.grace_seconds), idempotency_key)
    if outcome.status == "missing":
        raise NotFound(f"no key with id {key_id!r}", param="id")
    if outcome.status == "revoked":
        raise Conflict("a revoked key cannot be rotated", code="key_revoked")
    if outcome.status == "conflict" or outcome.created is None:
        raise Conflict("this Idempotency-Key was used for another rotation", code="idempotency")
    services.auth.invalidate(key_id)
    return json_response({**_view(outcome.created.record), "key": outcome.created.key})


async def revoke_key(request: Request, services: Services) -> Response:
    key_id = _key_id(request)
    record = await services.keys.revoke(key_id)
    if record is None:
        raise NotFound(f"no key with id {key_id!r}", param="id")
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
