"""Cancel marks in Redis: what every replica reads before a line's upstream call.

``POST .../cancel`` records ``cancelling`` in the SQL store and sets ``sy:batch:cancel:<id>``
before it answers; a runner reads the mark right before it hands a line to the pipeline, so no
line starts after the cancel was answered (lines already started finish, and are kept). The
mark lives as long as a batch may (its window and a day), so Redis holds one short string per
cancelled batch, no more.
"""

from __future__ import annotations

from redis.asyncio import Redis

from gateway.store.connect import REDIS_FAILURES

MARK_TTL_S = 2 * 24 * 3600


def mark_key(batch_id: str) -> str:
    return f"sy:batch:cancel:{batch_id}"


class CancelMarks:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def mark(self, batch_id: str) -> None:
        await self.redis.set(mark_key(batch_id), b"1", ex=MARK_TTL_S)

    async def marked(self, batch_id: str) -> bool | None:
        """Whether the batch was cancelled; None when Redis cannot say now."""
        try:
            return bool(await self.redis.exists(mark_key(batch_id)))
        except REDIS_FAILURES:
            return None
