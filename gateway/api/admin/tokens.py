"""Admin API for named admin tokens (``admin`` role): create (the token is in this answer
only), list, show and revoke. A revoked token is refused at once on every replica (tokens are
read from Redis on each use). Each change is in the audit log, without the token."""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from gateway.access import token_admin
from gateway.access.admins import Actor, AdminToken, AdminTokenView
from gateway.access.token_admin import TokenListQuery
from gateway.api.admin.audit import record_action
from gateway.api.endpoint import admin_routes
from gateway.api.http import json_response, read_json_object
from gateway.api.payloads import parse_query
from gateway.services import Services

MAX_TOKEN_BODY_BYTES = 4096


class IssuedAdminToken(AdminTokenView):
    """A token with its secret, which only the answer that issues it carries."""

    token: Annotated[str, msgspec.Meta(description="the secret, shown once")]


class AdminTokenList(TypedDict):
    object: Literal["list"]
    data: list[AdminTokenView]
    has_more: bool


def _issued(record: AdminToken, secret: str) -> IssuedAdminToken:
    return IssuedAdminToken(**record.public_view(), token=secret)


def _token_id(request: Request) -> str:
    return token_admin.checked_token_id(request.path_params["token_id"])


async def create_token(request: Request, services: Services, actor: Actor) -> Response:
    data = await read_json_object(request, MAX_TOKEN_BODY_BYTES)
    record, token = await token_admin.create_token(services.admins, data, actor)
    await record_action(
        services, request, actor, "token.create", f"token:{record.id}",
        after=record.public_view(),
    )  # fmt: skip
    return json_response(_issued(record, token), status=201)


async def list_tokens(request: Request, services: Services, actor: Actor) -> Response:
    query = parse_query(TokenListQuery, request)
    tokens, has_more = await token_admin.list_tokens(services.admins, query)
    data = [token.public_view() for token in tokens]
    return json_response(AdminTokenList(object="list", data=data, has_more=has_more))


async def get_token(request: Request, services: Services, actor: Actor) -> Response:
    record = await token_admin.show_token(services.admins, _token_id(request))
    return json_response(record.public_view())


async def revoke_token(request: Request, services: Services, actor: Actor) -> Response:
    token_id = _token_id(request)
    before = await services.admins.get(token_id)
    record = await token_admin.revoke_token(services.admins, token_id)
    await record_action(
        services, request, actor, "token.revoke", f"token:{token_id}",
        before=before.public_view() if before else None, after=record.public_view(),
    )  # fmt: skip
    return json_response(record.public_view())


ADMIN = "admin"
routes = [
    *admin_routes("/admin/tokens", ADMIN, POST=create_token, GET=list_tokens),
    *admin_routes("/admin/tokens/{token_id}", ADMIN, GET=get_token),
    *admin_routes("/admin/tokens/{token_id}/revoke", ADMIN, POST=revoke_token),
]
