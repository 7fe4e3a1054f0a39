"""The six key operations, written once for the admin API and the CLI: create, list, show,
update, rotate (with grace) and revoke.

Each takes the key store and the raw fields (a JSON body, or the CLI's flags; a list takes its
query already parsed), checks all of them before it changes anything, and raises ``GatewayError`` (``InvalidRequest`` naming the
field, ``NotFound``, ``Conflict``) for the caller to render: an OpenAI error envelope over HTTP,
one line on stderr in the CLI. Secrets appear only in what create and rotate return.

A key's ``team`` names a team (``gateway/access/teams.py``): when that team exists, the key's
limits state moves to the team's home and the team's limits apply to it too; a team name that
no team has is a label only (as every team was before teams existed), until a team of that id
is created and adopts the key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.access.key_models import (
    KeyCreate,
    KeyListQuery,
    KeyUpdate,
    RotateRequest,
    check_models,
    parse_key_payload,
)
from gateway.access.keys import ID_LENGTH, CreatedKey, KeyPage, KeyRecord, KeyStore
from gateway.access.records import found, missing, page_after
from gateway.access.teams import TeamStore, key_home, team_home
from gateway.errors import Conflict, InvalidRequest, NotFound, echo
from gateway.policy import Policy

MAX_IDEMPOTENCY_KEY_CHARS = 200


def checked_key_id(key_id: str) -> str:
    """A key id of the right shape; anything else cannot name a key (404)."""
    if len(key_id) != ID_LENGTH or not (key_id.isascii() and key_id.isalnum()):
        raise NotFound(f"no key with id {echo(key_id)}", param="id")
    return key_id


async def _home_for(teams: TeamStore, key_id: str, team: str | None) -> str:
    """Where a key of ``team`` keeps its limiter state: the team's slot if the team exists."""
    if team is not None and await teams.exists(team):
        return team_home(team)
    return key_home(key_id)


async def create_key(
    keys: KeyStore, teams: TeamStore, data: dict[str, Any], policy: Policy | None
) -> CreatedKey:
    """A new key from ``data``; its allow-list must name models of ``policy`` (when loaded)."""
    payload = parse_key_payload(KeyCreate, data)
    check_models(policy, payload.models)
    fields = payload.model_dump()
    if fields["expires_at"] is not None and fields["expires_at"] <= time.time():
        raise InvalidRequest("expires_at: must be in the future", param="expires_at")
    if fields["budget_usd"] is not None and fields["budget_period"] is None:
        fields["budget_period"] = "month"
    if fields["metadata"] is None:
        fields["metadata"] = {}
    team = fields["team"]
    joins = team is not None and await teams.exists(team)
    created = await keys.create(fields, home=team_home(team) if joins else None)
    if team is not None and not joins and await teams.exists(team):
        # The team was created meanwhile, and its adoption may have listed keys before this
        # one existed: join it now (moving an unused key carries nothing).
        record = await keys.update(created.record.id, {}, home=team_home(team))
        created = CreatedKey(record or created.record, created.key)
    return created


async def list_keys(keys: KeyStore, query: KeyListQuery) -> KeyPage:
    """One page of keys, filtered by ``team`` and ``status`` (an empty filter is no filter)."""
    listing = keys.list(
        limit=query.limit,
        after=query.after or None,
        team=query.team or None,
        status=query.status,
    )
    return await page_after(listing, "key")


async def show_key(keys: KeyStore, key_id: str) -> KeyRecord:
    return found(await keys.get(checked_key_id(key_id)), "key", key_id)


async def update_key(
    keys: KeyStore, teams: TeamStore, key_id: str, data: dict[str, Any], policy: Policy | None
) -> KeyRecord:
    """Only the fields in ``data`` change; an explicit null clears a limit or expiry. A new
    ``team`` moves the key's limits state to that team's home (or back to its own)."""
    checked_key_id(key_id)
    payload = parse_key_payload(KeyUpdate, data)
    check_models(policy, payload.models)
    changes = {name: getattr(payload, name) for name in data}
    if changes.get("metadata") is None and "metadata" in changes:
        changes["metadata"] = {}
    home = await _home_for(teams, key_id, changes["team"]) if "team" in changes else None
    return found(await keys.update(key_id, changes, home=home), "key", key_id)


@dataclass(frozen=True)
class Rotation:
    """A rotation's answer; ``replayed`` when an ``Idempotency-Key`` already used answered it
    again: nothing changed, so there is nothing new to audit."""

    created: CreatedKey
    replayed: bool


async def rotate_key(
    keys: KeyStore, key_id: str, data: dict[str, Any], idempotency_key: str | None
) -> CreatedKey:
    """A new secret; the old one keeps working for ``grace_seconds``. The same
    ``idempotency_key`` returns the same new key again instead of rotating twice."""
    return (await rotate_key_once(keys, key_id, data, idempotency_key)).created


async def rotate_key_once(
    keys: KeyStore, key_id: str, data: dict[str, Any], idempotency_key: str | None
) -> Rotation:
    """``rotate_key``, saying whether the answer is a replay (audit only the first)."""
    checked_key_id(key_id)
    payload = parse_key_payload(RotateRequest, data)
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters",
            param="Idempotency-Key",
        )
    outcome = await keys.rotate(key_id, float(payload.grace_seconds), idempotency_key)
    if outcome.status == "missing":
        raise missing("key", key_id)
    if outcome.status == "revoked":
        raise Conflict("a revoked key cannot be rotated", code="key_revoked")
    if outcome.status == "conflict" or outcome.created is None:
        raise Conflict("this Idempotency-Key was used for another rotation", code="idempotency")
    return Rotation(outcome.created, replayed=outcome.status == "replay")


async def revoke_key(keys: KeyStore, key_id: str) -> KeyRecord:
    return found(await keys.revoke(checked_key_id(key_id)), "key", key_id)
