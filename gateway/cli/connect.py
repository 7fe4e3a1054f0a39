"""The Redis a ``keys``, ``teams``, ``tokens`` or ``usage`` command talks to: the gateway's own.

``SWITCHYARD_REDIS_URL`` when set; otherwise the embedded Redis under DATA_DIR, reached over its
socket while the gateway runs, or started for the command (holding the DATA_DIR lock) when it
does not. The key pepper is checked against Redis's first, as the gateway checks it.
``admin_context`` adds what a command that changes something needs beside the key store: the
teams, the admin tokens, the limiter's key moves and the audit log (the command's actor is
``cli:<OS user>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis

from gateway.access.admins import Actor, AdminTokens
from gateway.access.keys import KeyStore, PepperMismatch, check_pepper
from gateway.access.teams import TeamStore
from gateway.audit.trail import AuditTrail, audit_trail
from gateway.data_dir import DataDirLock
from gateway.logs import build_logger
from gateway.metering.limits import Limiter
from gateway.metering.moves import LimitMoves
from gateway.settings import Settings, SettingsError, ensure_secrets
from gateway.store.connect import connect_redis
from gateway.store.embedded import EmbeddedRedis


@contextlib.asynccontextmanager
async def key_store(settings: Settings) -> AsyncIterator[KeyStore]:
    """The gateway's key store (its ``redis`` serves the usage report too), for one command."""
    secrets = ensure_secrets(settings)
    embedded: EmbeddedRedis | None = None
    lock = DataDirLock(settings.data_dir)
    url = settings.redis_url
    if not url:
        server = EmbeddedRedis(settings.redis_dir)
        url = server.url
        if not _answers(server):
            # The gateway is not running: own DATA_DIR and start Redis for this command.
            lock.acquire(exclusive=True)
            embedded = server
            await asyncio.to_thread(server.start)
    client = connect_redis(url, settings.redis_timeout_s)
    try:
        try:
            await check_pepper(client, secrets.key_pepper)
        except PepperMismatch as exc:
            raise SettingsError(str(exc)) from None
        yield KeyStore(client, secrets.key_pepper)
    finally:
        await client.aclose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        lock.release()


def _answers(server: EmbeddedRedis) -> bool:
    if not server.socket_path.exists():
        return False
    try:
        client = redis.Redis(unix_socket_path=str(server.socket_path), socket_timeout=1)
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


@dataclass(frozen=True)
class AdminContext:
    """Everything an admin command may change, and the audit log it answers to."""

    keys: KeyStore
    teams: TeamStore
    tokens: AdminTokens
    limiter: Limiter
    moves: LimitMoves
    audit: AuditTrail
    actor: Actor

    async def record(
        self, action: str, target: str, before: object = None, after: object = None
    ) -> None:
        await self.audit.record(
            self.actor, action, target, client="cli", before=before, after=after
        )


@contextlib.asynccontextmanager
async def admin_context(settings: Settings) -> AsyncIterator[AdminContext]:
    log = build_logger("warning", "console", sys.stderr)
    secrets = ensure_secrets(settings)
    async with key_store(settings) as keys, audit_trail(settings, log) as trail:
        limiter = Limiter(keys.redis, in_flight_lease_s=settings.inflight_lease_s)
        yield AdminContext(
            keys=keys,
            teams=TeamStore(keys.redis),
            tokens=AdminTokens(keys.redis, secrets.key_pepper, secrets.admin_key),
            limiter=limiter,
            moves=LimitMoves(keys.redis, keys, limiter, log),
            audit=trail,
            actor=Actor.cli(),
        )
