"""Dashboard sessions held server-side in Redis, so that they can end.

A login gets a fresh random token (256 bits); the cookie carries the token, Redis holds only its
SHA-256 under ``sy:dashboard:session:<hash>`` (a Redis dump never yields a usable cookie), with
the session's TTL. The stored value says who logged in and holds the session's CSRF token:

- the bootstrap admin key: a fingerprint of the key (an HMAC, never the key), so that when the
  admin key changes every session made with the old one stops working on its next request, on
  every replica;
- a named admin token: its id. The token is read again on every request, so revoking it ends
  its sessions at once, and a changed role applies at once.

The CSRF token (``csrf``) is a synchronizer token: random per session, kept server-side with
it, put in every form the dashboard draws, and compared in constant time on every POST.
Logout deletes the record.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

import orjson

from gateway.access.admins import Actor, AdminTokens
from gateway.store.connect import RedisClient

SESSION_PREFIX = "sy:dashboard:session:"
SESSION_TTL_S = 8 * 3600
_TOKEN_BYTES = 32
_MAX_TOKEN_CHARS = 100


def admin_key_fingerprint(admin_key: str) -> str:
    """What a session remembers of the admin key that opened it."""
    return hmac.new(admin_key.encode(), b"switchyard dashboard session", hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class DashboardSession:
    actor: Actor
    csrf: str

    def csrf_matches(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(
            presented.encode(),  # type: ignore[union-attr]
            self.csrf.encode(),
        )


class SessionStore:
    def __init__(
        self,
        redis: RedisClient,
        admin_key: str,
        admins: AdminTokens,
        ttl_s: int = SESSION_TTL_S,
    ) -> None:
        self._redis = redis
        self._fingerprint = admin_key_fingerprint(admin_key)
        self._admins = admins
        self.ttl_s = ttl_s

    @staticmethod
    def _key(token: str) -> str:
        return SESSION_PREFIX + hashlib.sha256(token.encode()).hexdigest()

    async def create(self, actor: Actor) -> str:
        """A new session for ``actor``; returns the token for the cookie."""
        token = secrets.token_urlsafe(_TOKEN_BYTES)
        value = {"kind": actor.kind, "csrf": secrets.token_urlsafe(_TOKEN_BYTES)}
        if actor.kind == "bootstrap":
            value["fingerprint"] = self._fingerprint
        else:
            value["token_id"] = actor.id
        await self._redis.set(self._key(token), orjson.dumps(value), ex=self.ttl_s)
        return token

    async def get(self, token: str | None) -> DashboardSession | None:
        """The session, while it exists and its credential still holds."""
        if not token or len(token) > _MAX_TOKEN_CHARS:
            return None
        stored = await self._redis.get(self._key(token))
        if not isinstance(stored, bytes):
            return None
        try:
            value = orjson.loads(stored)
            csrf = str(value["csrf"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None  # a session of an older version: log in again
        if value.get("kind") == "bootstrap":
            if hmac.compare_digest(str(value.get("fingerprint", "")), self._fingerprint):
                return DashboardSession(Actor.bootstrap(), csrf)
            return None
        record = await self._admins.get(str(value.get("token_id", "")))
        if record is None or record.status != "active":
            return None
        return DashboardSession(record.actor(), csrf)

    async def valid(self, token: str | None) -> bool:
        return await self.get(token) is not None

    async def end(self, token: str | None) -> None:
        if token and len(token) <= _MAX_TOKEN_CHARS:
            await self._redis.delete(self._key(token))
