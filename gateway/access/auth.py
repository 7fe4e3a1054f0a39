"""Bearer authentication: API keys for /v1, the admin key for /admin.

Verified key records are kept in-process for ``auth_cache_ttl_s`` (≤ 1 s) so that the hot path
rarely asks Redis; changes published by the KeyStore evict entries at once on every replica,
and the short TTL bounds staleness even if a change message is lost. When a key's entry lapses,
the requests that find it so share one read of the record: under load, as many requests as
arrive during that round trip would otherwise each read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from gateway.access.keys import CHANGES_CHANNEL, KeyRecord, KeyStore, parse_key
from gateway.errors import AuthenticationFailed, PermissionDenied, ServiceUnavailable
from gateway.settings import AuthSettings
from gateway.store.connect import RedisClient, change_feed

MAX_CACHED_KEYS = 100_000


@dataclass(frozen=True)
class Principal:
    key_id: str
    record: KeyRecord
    # True when Redis was unreachable and the key was trusted from a recent verification.
    degraded: bool = False


@dataclass
class _Cached:
    record: KeyRecord
    fetched_monotonic: float
    verified_wall: float  # last time Redis confirmed this record


def client_credential(headers: Mapping[str, str]) -> str | None:
    """A client's API key as an ``Authorization`` value: the bearer, else ``x-api-key``
    (Anthropic's SDKs send their key there). ``headers`` is case-insensitive."""
    authorization = headers.get("authorization")
    if authorization:
        return authorization
    api_key = headers.get("x-api-key")
    return f"Bearer {api_key.strip()}" if api_key and api_key.strip() else None


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Authenticator:
    def __init__(self, keys: KeyStore, settings: AuthSettings, *, fail_open: bool = False) -> None:
        """``fail_open``: the limits serve while Redis is down (``LimiterSettings.fail_open``)."""
        self.keys = keys
        self.cache_ttl_s = settings.cache_ttl_s
        self.fail_open = fail_open
        self.fail_open_window_s = settings.fail_open_window_s
        self._cache: dict[str, _Cached] = {}
        # The read of a key's record in flight, shared by the requests that await it.
        self._reads: dict[str, asyncio.Task[KeyRecord | None]] = {}

    def invalidate(self, key_id: str) -> None:
        """Forget the key's record, and a read of it already in flight (it may be older than
        the change): the next request reads it afresh."""
        self._cache.pop(key_id, None)
        self._reads.pop(key_id, None)

    async def refresh(self, key_id: str) -> KeyRecord | None:
        """Read a key's record again (it changed under a request) and cache the new one."""
        self.invalidate(key_id)
        record, _ = await self._record(key_id)
        return record

    async def authenticate(self, authorization: str | None) -> Principal:
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationFailed(
                "You didn't provide an API key. Send it as 'Authorization: Bearer sk-sy-...' "
                "or as 'x-api-key: sk-sy-...'.",
                code="missing_api_key",
            )
        parsed = parse_key(token)
        if parsed is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        key_id, secret = parsed
        record, degraded = await self._record(key_id)
        now = time.time()
        if record is None or not self.keys.verify_secret(record, secret, now):
            raise AuthenticationFailed("Incorrect API key provided.")
        status = record.effective_status(now)
        if status == "revoked":
            raise AuthenticationFailed("This API key has been revoked.", code="key_revoked")
        if status == "expired":
            raise AuthenticationFailed("This API key has expired.", code="key_expired")
        return Principal(key_id, record, degraded)

    async def principal_of(self, key_id: str) -> Principal:
        """The key ``key_id`` without its secret, for work the key itself queued earlier (a
        batch's lines): refused as ``authenticate`` would once it is gone, revoked or expired."""
        record, degraded = await self._record(key_id)
        if record is None:
            raise AuthenticationFailed("The batch's API key no longer exists.")
        status = record.effective_status(time.time())
        if status == "revoked":
            raise AuthenticationFailed("This API key has been revoked.", code="key_revoked")
        if status == "expired":
            raise AuthenticationFailed("This API key has expired.", code="key_expired")
        return Principal(key_id, record, degraded)

    async def _record(self, key_id: str) -> tuple[KeyRecord | None, bool]:
        cached = self._cache.get(key_id)
        now = time.monotonic()
        if cached is not None and now - cached.fetched_monotonic < self.cache_ttl_s:
            return cached.record, False
        read = self._reads.get(key_id)
        if read is None:
            read = asyncio.ensure_future(self.keys.get(key_id))
            self._reads[key_id] = read
            read.add_done_callback(partial(self._keep, key_id, now))
        try:
            # Shielded: a request that leaves (its client gone) does not cancel the others' read.
            record = await asyncio.shield(read)
        except Exception as exc:
            # Not only REDIS_FAILURES: redis-py can fail with a plain Python error while a
            # cluster connection is torn down, and a garbled record fails to decode. Either way
            # the key store could not answer: 503 (or fail-open), never a 500.
            recent = (
                cached is not None and time.time() - cached.verified_wall < self.fail_open_window_s
            )
            if self.fail_open and recent and cached is not None:
                return cached.record, True
            raise ServiceUnavailable(
                "The key store is unavailable; try again shortly.", code="redis_unavailable"
            ) from exc
        return record, False

    def _keep(self, key_id: str, started: float, read: asyncio.Task[KeyRecord | None]) -> None:
        """Cache what a read found, unless the key was invalidated while it was in flight."""
        failed = read.cancelled() or read.exception() is not None  # retrieved: no warning
        if self._reads.get(key_id) is not read:
            return
        del self._reads[key_id]
        if failed:
            return
        record = read.result()
        if record is None:
            self._cache.pop(key_id, None)
            return
        if len(self._cache) >= MAX_CACHED_KEYS:
            self._cache.clear()
        self._cache[key_id] = _Cached(record, started, time.time())

    async def watch_changes(self, redis: RedisClient, log: Any) -> None:
        """Evict keys named on the changes channel; reconnect after Redis outages."""
        while True:
            pubsub = change_feed(redis)
            try:
                await pubsub.subscribe(CHANGES_CHANNEL)
                # Entries cached (or read) while unsubscribed may have missed a change.
                self._cache.clear()
                self._reads.clear()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self.invalidate(message["data"].decode())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any disconnect: retry, the TTL covers the gap
                log.debug("key change feed lost", error=type(exc).__name__)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


def admin_token(authorization: str | None) -> str:
    """The bearer of an admin request; a missing one is a 401."""
    token = bearer_token(authorization)
    if token is None:
        raise AuthenticationFailed(
            "Admin endpoints need 'Authorization: Bearer <admin key>'.", code="missing_api_key"
        )
    return token


def is_admin_key(token: str, admin_key: str) -> bool:
    return hmac.compare_digest(token.encode(), admin_key.encode())


def check_admin(authorization: str | None, admin_key: str) -> None:
    """Missing credentials -> 401; anything but the admin key -> 403."""
    if not is_admin_key(admin_token(authorization), admin_key):
        raise PermissionDenied("This endpoint needs the admin key.", code="admin_key_required")
