"""The six key operations, written once for the admin API and the CLI: create, list, show,
update, rotate (with grace) and revoke.

Each takes the key store and the raw fields (a JSON body, or the CLI's flags; a list takes its
query already parsed), checks all of them before it changes anything, and raises ``GatewayError`` (``InvalidRequest`` naming the
field, ``NotFound``, ``Conflict``) for the caller to render: an OpenAI error envelope over HTTP,
one line on stderr in the CLI. Secrets appear only in what create and rotate return.
"""

from __future__ import annotations

import time
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
from gateway.errors import Conflict, InvalidRequest, NotFound, echo
from gateway.routing.policy import Policy

MAX_IDEMPOTENCY_KEY_CHARS = 200


def checked_key_id(key_id: str) -> str:
    """A key id of the right shape; anything else cannot name a key (404)."""
    if len(key_id) != ID_LENGTH or not (key_id.isascii() and key_id.isalnum()):
        raise NotFound(f"no key with id {echo(key_id)}", param="id")
    return key_id


def _missing(key_id: str) -> NotFound:
    return NotFound(f"no key with id {key_id!r}", param="id")


def _found(record: KeyRecord | None, key_id: str) -> KeyRecord:
    if record is None:
        raise _missing(key_id)
    return record


async def create_key(keys: KeyStore, data: dict[str, Any], policy: Policy | None) -> CreatedKey:
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
    return await keys.create(fields)


async def list_keys(keys: KeyStore, query: KeyListQuery) -> KeyPage:
    """One page of keys, filtered by ``team`` and ``status`` (an empty filter is no filter)."""
    try:
        return await keys.list(
            limit=query.limit,
            after=query.after or None,
            team=query.team or None,
            status=query.status,
        )
    except KeyError:
        raise InvalidRequest("after: no key with that id", param="after") from None


async def show_key(keys: KeyStore, key_id: str) -> KeyRecord:
    return _found(await keys.get(checked_key_id(key_id)), key_id)


async def update_key(
    keys: KeyStore, key_id: str, data: dict[str, Any], policy: Policy | None
) -> KeyRecord:
    """Only the fields in ``data`` change; an explicit null clears a limit or expiry."""
    checked_key_id(key_id)
    payload = parse_key_payload(KeyUpdate, data)
    check_models(policy, payload.models)
    changes = {name: getattr(payload, name) for name in data}
    if changes.get("metadata") is None and "metadata" in changes:
        changes["metadata"] = {}
    return _found(await keys.update(key_id, changes), key_id)


async def rotate_key(
    keys: KeyStore, key_id: str, data: dict[str, Any], idempotency_key: str | None
) -> CreatedKey:
    """A new secret; the old one keeps working for ``grace_seconds``. The same
    ``idempotency_key`` returns the same new key again instead of rotating twice."""
    checked_key_id(key_id)
    payload = parse_key_payload(RotateRequest, data)
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters",
            param="Idempotency-Key",
        )
    outcome = await keys.rotate(key_id, float(payload.grace_seconds), idempotency_key)
    if outcome.status == "missing":
        raise _missing(key_id)
    if outcome.status == "revoked":
        raise Conflict("a revoked key cannot be rotated", code="key_revoked")
    if outcome.status == "conflict" or outcome.created is None:
        raise Conflict("this Idempotency-Key was used for another rotation", code="idempotency")
    return outcome.created


async def revoke_key(keys: KeyStore, key_id: str) -> KeyRecord:
    return _found(await keys.revoke(checked_key_id(key_id)), key_id)
