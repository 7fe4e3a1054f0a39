"""The alert outbox: one Redis stream, ``sy:alerts:outbox``, read by a consumer group.

An ``Alert`` is one threshold of one budget window crossed by one scope (a key or a team). Its
id is derived from exactly those (scope, id, period, window, threshold), so the same crossing
always has the same id: a receiver can drop repeats by it. ``AlertOutbox.enqueue`` appends the
alerts of a settle batch in one round trip; the deliverer takes them from there.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

OUTBOX_KEY = "sy:alerts:outbox"
GROUP = "deliverers"
DELIVERED_PREFIX = "sy:alerts:delivered:"
# Entries the stream keeps at most (delivered ones are deleted; this bounds a dead webhook).
OUTBOX_MAXLEN = 100_000


def alert_id(scope: str, scope_id: str, period: str, window: str, threshold: int) -> str:
    text = f"{scope}|{scope_id}|{period}|{window}|{threshold}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Alert:
    id: str
    scope: str  # "key" or "team"
    scope_id: str
    period: str  # day, week, month or total
    window: str  # "2026-11-30", "2026-W49", "2026-11" or "total"
    threshold_percent: int
    spent_nanos: int  # the budget window's spend right after the crossing settle
    budget_nanos: int
    at_ms: int  # when it was found (the gateway's clock)

    @classmethod
    def crossed(
        cls,
        *,
        scope: str,
        scope_id: str,
        period: str,
        window: str,
        threshold: int,
        spent_nanos: int,
        budget_nanos: int,
        at_ms: int,
    ) -> Alert:
        return cls(
            alert_id(scope, scope_id, period, window, threshold),
            scope,
            scope_id,
            period,
            window,
            threshold,
            spent_nanos,
            budget_nanos,
            at_ms,
        )

    def payload(self) -> dict[str, Any]:
        """The webhook's JSON body (money as exact integer nano-dollars)."""
        return {"object": "budget_alert", "type": "budget.threshold_crossed", **asdict(self)}


class AlertOutbox:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def enqueue(self, alerts: list[Alert]) -> None:
        """Append alerts to the outbox, one round trip for all of them."""
        if not alerts:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for alert in alerts:
                pipe.xadd(
                    OUTBOX_KEY,
                    {"id": alert.id, "body": orjson.dumps(alert.payload())},
                    maxlen=OUTBOX_MAXLEN,
                    approximate=True,
                )
            await pipe.execute()
