"""Who may use the admin API: the bootstrap admin key, and named admin tokens with roles.

Roles, each including the ones before it: ``viewer`` reads usage reports; ``operator`` also
manages keys and teams (and reads the policy); ``admin`` may do everything (the policy, admin
tokens, the audit log). Every admin route declares the role it needs (``api/endpoint.py``).

A named token reads ``sy-tok-<id>-<secret>`` and is shown once, when created. Redis holds only
HMAC-SHA256(pepper, secret) under ``sy:{admintoken:<id>}`` (listed in ``sy:admintokens:index``),
compared in constant time, as API keys are. Tokens are read from Redis on every use, so a
revocation holds at once on every replica. The bootstrap key (``SWITCHYARD_ADMIN_KEY``) stays a
break-glass credential with the ``admin`` role: it is checked first and needs no Redis.
"""

from __future__ import annotations

import getpass
import hmac
import secrets
import string
import time
from dataclasses import dataclass
from typing import Literal, TypedDict

from redis.asyncio import Redis

from gateway.access.keys import hash_secret, parse_prefixed_secret
from gateway.store.index import index_page

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "admin")
TOKEN_PREFIX = "sy-tok-"
TOKEN_INDEX_KEY = "sy:admintokens:index"
_ID_LENGTH, _SECRET_LENGTH = 16, 40
_ID_ALPHABET = string.ascii_lowercase + string.digits
_ALPHABET = string.ascii_letters + string.digits


def role_rank(role: str) -> int:
    return ROLES.index(role)  # type: ignore[arg-type]


def token_record_key(token_id: str) -> str:
    return f"sy:{{admintoken:{token_id}}}"


@dataclass(frozen=True)
class Actor:
    """Who did something: the bootstrap key, a named token, or the local CLI."""

    kind: Literal["bootstrap", "token", "cli"]
    id: str
    name: str
    role: Role

    @classmethod
    def bootstrap(cls) -> Actor:
        return cls("bootstrap", "bootstrap", "bootstrap", "admin")

    @classmethod
    def cli(cls) -> Actor:
        """The ``switchyard`` command run on the gateway's host: its OS user, full rights
        (it reads the gateway's own settings and secrets)."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        return cls("cli", f"cli:{user}", user, "admin")

    def may(self, role: Role) -> bool:
        return role_rank(self.role) >= role_rank(role)

    def view(self) -> dict[str, str]:
        return {"kind": self.kind, "id": self.id, "name": self.name, "role": self.role}


class AdminTokenView(TypedDict):
    """A named admin token as the admin API shows it (``AdminToken.public_view``)."""

    id: str
    object: Literal["admin_token"]
    name: str
    role: Role
    status: Literal["active", "revoked"]
    created_at: float
    created_by: str
    revoked_at: float | None


@dataclass(frozen=True)
class AdminToken:
    id: str
    name: str
    role: Role
    secret_hash: str
    created_at: float
    created_by: str
    status: str = "active"  # active | revoked
    revoked_at: float | None = None

    def public_view(self) -> AdminTokenView:
        """Never the hash."""
        return {
            "id": self.id,
            "object": "admin_token",
            "name": self.name,
            "role": self.role,
            "status": self.status,
            "created_at": self.created_at,
            "created_by": self.created_by,
            "revoked_at": self.revoked_at,
        }

    def actor(self) -> Actor:
        return Actor("token", self.id, self.name, self.role)


def _decode(raw: dict[bytes, bytes]) -> AdminToken:
    values = {name.decode(): value.decode() for name, value in raw.items()}
    return AdminToken(
        id=values["id"],
        name=values["name"],
        role=values["role"],  # type: ignore[arg-type]
        secret_hash=values["secret_hash"],
        created_at=float(values["created_at"]),
        created_by=values.get("created_by", ""),
        status=values.get("status", "active"),
        revoked_at=float(values["revoked_at"]) if "revoked_at" in values else None,
    )


def parse_token(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed named token, else None."""
    return parse_prefixed_secret(token, TOKEN_PREFIX, _ID_LENGTH, _SECRET_LENGTH)


_REVOKE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'revoked' then
  redis.call('HSET', KEYS[1], 'status', 'revoked', 'revoked_at', ARGV[1])
end
return 1
"""


class AdminTokens:
    """Named admin tokens: create (the token shown once), get, list, revoke, and ``resolve``,
    which turns a presented bearer into its ``Actor``."""

    def __init__(self, redis: Redis, pepper: bytes, bootstrap_key: str) -> None:
        self.redis = redis
        self.pepper = pepper
        self._bootstrap = bootstrap_key.encode()
        self._revoke = redis.register_script(_REVOKE)

    def is_bootstrap(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self._bootstrap)

    async def resolve(self, token: str) -> Actor | None:
        """The actor a bearer proves, or None (unknown, wrong or revoked). The bootstrap key
        needs no Redis; a named token is read from Redis each time."""
        if self.is_bootstrap(token):
            return Actor.bootstrap()
        parsed = parse_token(token)
        if parsed is None:
            return None
        record = await self.get(parsed[0])
        if record is None or record.status != "active":
            return None
        presented = hash_secret(self.pepper, parsed[1])
        if not hmac.compare_digest(presented, record.secret_hash):
            return None
        return record.actor()

    async def create(self, name: str, role: Role, created_by: str) -> tuple[AdminToken, str]:
        """The new token's record, and the token itself (shown once)."""
        token_id = "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))
        secret = "".join(secrets.choice(_ALPHABET) for _ in range(_SECRET_LENGTH))
        record = AdminToken(
            id=token_id,
            name=name,
            role=role,
            secret_hash=hash_secret(self.pepper, secret),
            created_at=time.time(),
            created_by=created_by,
        )
        mapping = {
            "id": record.id,
            "name": record.name,
            "role": record.role,
            "secret_hash": record.secret_hash,
            "created_at": repr(record.created_at),
            "created_by": record.created_by,
            "status": record.status,
        }
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(token_record_key(token_id), mapping=mapping)
            pipe.zadd(TOKEN_INDEX_KEY, {token_id: record.created_at})
            await pipe.execute()
        return record, f"{TOKEN_PREFIX}{token_id}-{secret}"

    async def get(self, token_id: str) -> AdminToken | None:
        raw = await self.redis.hgetall(token_record_key(token_id))
        return _decode(raw) if raw else None

    async def revoke(self, token_id: str) -> AdminToken | None:
        if not await self._revoke(keys=[token_record_key(token_id)], args=[repr(time.time())]):
            return None
        return await self.get(token_id)

    async def list(
        self, *, limit: int = 100, after: str | None = None
    ) -> tuple[list[AdminToken], bool]:
        raws, more = await index_page(
            self.redis, TOKEN_INDEX_KEY, token_record_key, limit=limit, after=after
        )
        return [_decode(raw) for raw in raws], more
