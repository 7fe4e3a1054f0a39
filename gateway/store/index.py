"""Records listed in creation order: ids in a sorted-set index (scored by creation time), each
record a hash of its own. ``index_page`` reads one page of them in two round trips."""

from __future__ import annotations

from collections.abc import Callable

from gateway.store.connect import RedisClient


async def index_page(
    redis: RedisClient,
    index_key: str,
    record_key: Callable[[str], str],
    *,
    limit: int,
    after: str | None = None,
) -> tuple[list[dict[bytes, bytes]], bool]:
    """Up to ``limit`` records (their raw hashes) from after the id ``after``, and whether more
    follow. A listed id whose record is gone (deleted meanwhile) is left out. ``KeyError``: no
    such ``after`` id."""
    start = 0
    if after is not None:
        rank = await redis.zrank(index_key, after)
        if rank is None:
            raise KeyError(after)
        start = rank + 1
    ids = await redis.zrange(index_key, start, start + limit)
    async with redis.pipeline(transaction=False) as pipe:
        for record_id in ids:
            pipe.hgetall(record_key(record_id.decode()))
        raws = await pipe.execute()
    return [raw for raw in raws if raw][:limit], len(ids) > limit
