"""Delivers the outbox's alerts as HMAC-signed webhooks: at least once, retried with backoff.

Every gateway runs one ``AlertDeliverer`` (a background part), a consumer of the outbox's group.
A new alert is POSTed by whichever gateway reads it first. A failed try (no answer within the
timeout, or not 2xx) leaves the entry pending; it is tried again once it has been idle for the
backoff of its number of tries (``retry_initial_s`` doubling up to ``retry_max_s``), by this
gateway or, if this one died, by any other (XCLAIM, so only one takes it; another gateway's
entry must also have been idle past the POST timeout, so a slow try is never doubled). A 2xx
marks the alert delivered (``sy:alerts:delivered:<id>``, kept 40 days) before the entry is
acknowledged and deleted: an alert found marked is never sent again. After ``max_attempts``
tries it is dropped with an error log. At least once: a gateway dying between a 2xx and the
mark sends it again, with the same ``x-switchyard-alert-id`` for the receiver to drop.

Signature: ``x-switchyard-signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`` with
``x-switchyard-timestamp`` (unix seconds), so a receiver can refuse replays of old bodies.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import socket
import time
from typing import Any

import aiohttp
import redis.exceptions
from redis.asyncio import Redis

from gateway.alerts.outbox import DELIVERED_PREFIX, GROUP, OUTBOX_KEY
from gateway.settings import AlertSettings
from gateway.store.connect import REDIS_FAILURES

DELIVERED_TTL_S = 40 * 24 * 3600
BATCH = 32


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"v1={mac}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class AlertDeliverer:
    def __init__(self, redis: Redis, settings: AlertSettings, log: Any) -> None:
        self.redis = redis
        self.settings = settings
        self.log = log
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._session: aiohttp.ClientSession | None = None

    async def run(self) -> None:
        """Deliver until cancelled; Redis failures are logged and waited out."""
        if not self.settings.enabled:
            return
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self._session = session
            while True:
                try:
                    busy = await self.tick()
                except REDIS_FAILURES as exc:
                    self.log.warning("alert_outbox_unavailable", error=type(exc).__name__)
                    busy = False
                except Exception as exc:  # an error reply: keep delivering, say so
                    self.log.error("alert_deliverer_failed", error=str(exc)[:300])
                    busy = False
                if not busy:
                    await asyncio.sleep(self.settings.poll_s)

    async def tick(self) -> bool:
        """One pass: retries due, then new alerts. True when there may be more to do now."""
        await self._ensure_group()
        entries = await self._due_retries()
        reply = await self.redis.xreadgroup(GROUP, self.consumer, {OUTBOX_KEY: ">"}, count=BATCH)
        for _, new in reply or []:
            entries += [(entry_id, fields, 1) for entry_id, fields in new]
        for entry_id, fields, tries in entries:
            await self._deliver(entry_id, fields, tries)
        return len(entries) >= BATCH

    async def _ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(OUTBOX_KEY, GROUP, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _due_retries(self) -> list[tuple[bytes, dict, int]]:
        """Pending entries whose backoff is over, claimed for this gateway (one claim wins)."""
        pending = await self.redis.xpending_range(OUTBOX_KEY, GROUP, "-", "+", BATCH)
        due = []
        for item in pending:
            tries = int(item["times_delivered"])
            wait_s = self.settings.backoff_s(tries)
            if _text(item["consumer"]) != self.consumer:
                wait_s += self.settings.timeout_s  # its owner may still be trying it
            if item["time_since_delivered"] < wait_s * 1000:
                continue
            claimed = await self.redis.xclaim(
                OUTBOX_KEY, GROUP, self.consumer, round(wait_s * 1000), [item["message_id"]]
            )
            due += [(entry_id, fields, tries + 1) for entry_id, fields in claimed if fields]
        return due

    async def _deliver(self, entry_id: bytes, fields: dict, tries: int) -> None:
        alert_id = _text(fields[b"id"])
        body = fields[b"body"]
        if await self.redis.exists(DELIVERED_PREFIX + alert_id):
            await self._done(entry_id)  # delivered already (a repeat): never send it twice
            return
        status = await self._post(alert_id, body)
        if status is not None and 200 <= status < 300:
            await self.redis.set(DELIVERED_PREFIX + alert_id, str(tries), ex=DELIVERED_TTL_S)
            await self._done(entry_id)
            self.log.info("alert_delivered", alert_id=alert_id, tries=tries)
        elif tries >= self.settings.max_attempts:
            await self._done(entry_id)
            self.log.error("alert_dropped", alert_id=alert_id, tries=tries, status=status)
        else:
            self.log.warning(
                "alert_delivery_failed",
                alert_id=alert_id,
                tries=tries,
                status=status,
                retry_in_s=self.settings.backoff_s(tries),
            )

    async def _post(self, alert_id: str, body: bytes) -> int | None:
        """The webhook's status, or None when it did not answer (the reason is logged)."""
        assert self._session is not None
        timestamp = str(int(time.time()))
        headers = {
            "content-type": "application/json",
            "x-switchyard-alert-id": alert_id,
            "x-switchyard-timestamp": timestamp,
            "x-switchyard-signature": signature(self.settings.secret, timestamp, body),
        }
        try:
            async with self._session.post(
                self.settings.webhook_url, data=body, headers=headers
            ) as response:
                await response.read()
                return response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.log.warning(
                "alert_webhook_unreachable", alert_id=alert_id, error=type(exc).__name__
            )
            return None

    async def _done(self, entry_id: bytes) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xack(OUTBOX_KEY, GROUP, entry_id)
            pipe.xdel(OUTBOX_KEY, entry_id)
            await pipe.execute()
