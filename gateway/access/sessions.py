"""Dashboard sessions held server-side in Redis, so that they can end.

A login gets a fresh random token (256 bits); the cookie carries the token, Redis holds only its
SHA-256 under ``sy:dashboard:session:<hash>`` (a Redis dump never yields a usable cookie), with
the session's TTL. The stored value is a fingerprint of the admin key the login proved (an HMAC,
never the key): when the admin key changes, every session made with the old one stops working on
its next request, on every replica. Logout deletes the record.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from gateway.store.connect import RedisClient

SESSION_PREFIX = "sy:dashboard:session:"
SESSION_TTL_S = 8 * 3600
_TOKEN_BYTES = 32
_MAX_TOKEN_CHARS = 100


def admin_key_fingerprint(admin_key: str) -> bytes:
    """What a session remembers of the admin key that opened it."""
    return hmac.new(admin_key.encode(), b"switchyard dashboard session", hashlib.sha256).digest()


class SessionStore:
    def __init__(self, redis: RedisClient, admin_key: str, ttl_s: int = SESSION_TTL_S) -> None:
        self._redis = redis
        self._fingerprint = admin_key_fingerprint(admin_key)
        self.ttl_s = ttl_s

    @staticmethod
    def _key(token: str) -> str:
        return SESSION_PREFIX + hashlib.sha256(token.encode()).hexdigest()

    async def create(self) -> str:
        """A new session; returns the token for the cookie."""
        token = secrets.token_urlsafe(_TOKEN_BYTES)
        await self._redis.set(self._key(token), self._fingerprint, ex=self.ttl_s)
        return token

    async def valid(self, token: str | None) -> bool:
        """True while the session exists and was opened with the current admin key."""
        if not token or len(token) > _MAX_TOKEN_CHARS:
            return False
        stored = await self._redis.get(self._key(token))
        return isinstance(stored, bytes) and hmac.compare_digest(stored, self._fingerprint)

    async def end(self, token: str | None) -> None:
        if token and len(token) <= _MAX_TOKEN_CHARS:
            await self._redis.delete(self._key(token))
