"""Admin API for keys: create, list, show, update, rotate (with grace), revoke.

Every endpoint needs an admin credential with the ``operator`` role or above (``Guard.ADMIN``:
none → 401, an unknown one → 403, and past ``SWITCHYARD_AUTH_FAILURE_LIMIT`` wrong ones from one
address → 429 for the rest of the window; a ``viewer`` token → 403 ``insufficient_role``). The
operations themselves are ``gateway.access.key_admin``'s, shared with the CLI: payloads are
strict (an unknown or malformed field is a 400 that names it), and secrets appear only in the
create and rotate responses, never in a log or the audit log, which records every change
with who made it.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from gateway.access import key_admin
from gateway.access.admins import Actor
from gateway.access.key_models import KeyListQuery
from gateway.access.keys import KeyRecord, KeyView
from gateway.api.admin.audit import record_action
from gateway.api.endpoint import admin_routes
from gateway.api.http import json_response, read_json_object
from gateway.api.id_page import IdPage, id_page
from gateway.api.payloads import parse_query
from gateway.services import Services

MAX_KEY_BODY_BYTES = 65536


class IssuedKey(KeyView):
    """A key with its secret, which only the answer that issues it carries."""

    key: Annotated[str, msgspec.Meta(description="the secret, shown once")]


class KeyList(IdPage):
    object: Literal["list"]
    data: list[KeyView]


def _key_id(request: Request) -> str:
    return key_admin.checked_key_id(request.path_params["key_id"])


def _view(record: KeyRecord) -> KeyView:
    return record.public_view()


def _issued(record: KeyRecord, secret: str) -> IssuedKey:
    return IssuedKey(**record.public_view(), key=secret)


async def follow_moves(services: Services, before: KeyRecord | None, after: KeyRecord) -> None:
    """A key that changed teams: carry its limiter counters over now rather than within the
    background sweep's second (a failure here leaves it to that sweep)."""
    if before is not None and after.home_epoch == before.home_epoch:
        return
    try:
        await services.moves.sweep_key(after.id)
    except Exception as exc:  # Redis hiccup: the background sweep finishes the move
        services.log.warning("limit_move_deferred", key_id=after.id, error=type(exc).__name__)


async def create_key(request: Request, services: Services, actor: Actor) -> Response:
    data = await read_json_object(request, MAX_KEY_BODY_BYTES)
    created = await key_admin.create_key(
        services.keys, services.teams, data, services.policies.policy_or_none()
    )
    await record_action(
        services, request, actor, "key.create", f"key:{created.record.id}",
        after=_view(created.record),
    )  # fmt: skip
    await follow_moves(services, created.record, created.record)
    return json_response(_issued(created.record, created.key), status=201)


async def list_keys(request: Request, services: Services, actor: Actor) -> Response:
    page = await key_admin.list_keys(services.keys, parse_query(KeyListQuery, request))
    data = [_view(record) for record in page.records]
    answer = KeyList(object="list", data=data, **id_page(data, page.has_more))
    return json_response(answer)


async def get_key(request: Request, services: Services, actor: Actor) -> Response:
    return json_response(_view(await key_admin.show_key(services.keys, _key_id(request))))


async def update_key(request: Request, services: Services, actor: Actor) -> Response:
    key_id = _key_id(request)
    data = await read_json_object(request, MAX_KEY_BODY_BYTES)
    before = await services.keys.get(key_id)
    record = await key_admin.update_key(
        services.keys, services.teams, key_id, data, services.policies.policy_or_none()
    )
    services.auth.invalidate(key_id)
    await record_action(
        services, request, actor, "key.update", f"key:{key_id}",
        before=_view(before) if before else None, after=_view(record),
    )  # fmt: skip
    await follow_moves(services, before, record)
    return json_response(_view(record))


async def rotate_key(request: Request, services: Services, actor: Actor) -> Response:
    key_id = _key_id(request)
    raw = await request.body()  # an empty body means the defaults
    data = await read_json_object(request, MAX_KEY_BODY_BYTES) if raw.strip() else {}
    idempotency_key = request.headers.get("idempotency-key")
    before = await services.keys.get(key_id)
    rotation = await key_admin.rotate_key_once(services.keys, key_id, data, idempotency_key)
    created = rotation.created
    services.auth.invalidate(key_id)
    if not rotation.replayed:  # a replay changed nothing: the first answer is audited already
        await record_action(
            services, request, actor, "key.rotate", f"key:{key_id}",
            before=_view(before) if before else None, after=_view(created.record),
        )  # fmt: skip
    return json_response(_issued(created.record, created.key))


async def revoke_key(request: Request, services: Services, actor: Actor) -> Response:
    key_id = _key_id(request)
    before = await services.keys.get(key_id)
    record = await key_admin.revoke_key(services.keys, key_id)
    services.auth.invalidate(key_id)
    await record_action(
        services, request, actor, "key.revoke", f"key:{key_id}",
        before=_view(before) if before else None, after=_view(record),
    )  # fmt: skip
    return json_response(_view(record))


OPERATOR = "operator"
routes = [
    *admin_routes("/admin/keys", OPERATOR, POST=create_key, GET=list_keys),
    *admin_routes("/admin/keys/{key_id}", OPERATOR, GET=get_key, PATCH=update_key),
    *admin_routes("/admin/keys/{key_id}/rotate", OPERATOR, POST=rotate_key),
    *admin_routes("/admin/keys/{key_id}/revoke", OPERATOR, POST=revoke_key),
]
