"""The admin-token operations, written once for the admin API and the CLI: create (the token
shown once), list, show and revoke. Input is checked before anything changes; refusals are
``GatewayError`` for the caller to render."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.access.admins import Actor, AdminToken, AdminTokens, Role
from gateway.access.key_models import Name, parse_key_payload
from gateway.access.records import found, page_after
from gateway.errors import NotFound, echo

_ID_LENGTH = 16


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name
    role: Role


class TokenListQuery(BaseModel):
    """``GET /admin/tokens`` query parameters."""

    model_config = ConfigDict(extra="forbid")
    limit: Annotated[int, Field(ge=1, le=1000)] = 100
    after: Annotated[str, Field(max_length=200)] | None = None


def checked_token_id(token_id: str) -> str:
    if len(token_id) != _ID_LENGTH or not (token_id.isascii() and token_id.isalnum()):
        raise NotFound(f"no admin token with id {echo(token_id)}", param="id")
    return token_id


async def create_token(
    tokens: AdminTokens, data: dict[str, Any], by: Actor
) -> tuple[AdminToken, str]:
    payload = parse_key_payload(TokenCreate, data)
    return await tokens.create(payload.name, payload.role, created_by=by.id)


async def list_tokens(tokens: AdminTokens, query: TokenListQuery) -> tuple[list[AdminToken], bool]:
    return await page_after(
        tokens.list(limit=query.limit, after=query.after or None), "admin token"
    )


async def show_token(tokens: AdminTokens, token_id: str) -> AdminToken:
    return found(await tokens.get(checked_token_id(token_id)), "admin token", token_id)


async def revoke_token(tokens: AdminTokens, token_id: str) -> AdminToken:
    return found(await tokens.revoke(checked_token_id(token_id)), "admin token", token_id)
