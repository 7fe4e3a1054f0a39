"""The cache in real Redis: hits and misses, team scoping, TTL, max entries, max-age, purge by
model and team (a store racing a purge is refused), stats, bounded memory, one slot per scope,
and Redis failures reported as CacheUnavailable."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio
from redis.cluster import key_slot

from gateway.cache import (
    CacheEntry,
    CacheScope,
    CacheUnavailable,
    ResponseCache,
)
from gateway.cache import store as store_module
from gateway.policy import CachePolicy
from gateway.store.embedded import EmbeddedRedis

POLICY = CachePolicy(ttl_s=60)
KEY = "a" * 64


def scope(team: str | None = "alpha", model: str = "fake-model", shared: bool = False):
    return CacheScope.of(model=model, team=team, key_id="k-" + str(team), shared=shared)


def answer(text: str = "4", created_ms: int | None = None) -> CacheEntry:
    now = time.time_ns() // 1_000_000 if created_ms is None else created_ms
    body = b'{"id":"chatcmpl-1","choices":[{"message":{"content":"%s"}}]}' % text.encode()
    return CacheEntry("json", "fake-model", "fake", created_ms=now, body=body)


async def put(
    cache: ResponseCache, where: CacheScope, key: str, entry: CacheEntry, policy=POLICY
) -> str:
    looked = await cache.lookup(where, key, policy)
    return await cache.store(where, key, entry, policy, epoch=looked.epoch)


async def test_second_lookup_hits_and_counts(cache: ResponseCache) -> None:
    alpha = scope()
    assert (await cache.lookup(alpha, KEY, POLICY)).entry is None
    assert await cache.store(alpha, KEY, answer(), POLICY, epoch=0) == "stored"
    hit = await cache.lookup(alpha, KEY, POLICY)
    assert hit.entry == answer(created_ms=hit.entry.created_ms)
    cache.note(alpha, "bypass", POLICY)
    cache.note(alpha, "skip_nondeterministic", POLICY)
    stats = await cache.stats()
    assert stats.entries == 1 and stats.hit_ratio == 0.5
    counters = stats.counters
    assert (counters["hit"], counters["miss"], counters["store"]) == (1, 1, 1)
    assert (counters["bypass"], counters["skip_nondeterministic"]) == (1, 1)
    (row,) = stats.scopes
    assert (row.namespace, row.model, row.entries) == ("team:alpha", "fake-model", 1)
    assert stats.to_dict()["scopes"][0]["hit"] == 1
    with pytest.raises(ValueError, match="unknown cache counter"):
        cache.note(alpha, "hit", POLICY)


async def test_teams_never_share_an_entry_unless_the_policy_says_so(
    cache: ResponseCache,
) -> None:
    await put(cache, scope("alpha"), KEY, answer("alpha's"))
    assert (await cache.lookup(scope("beta"), KEY, POLICY)).entry is None
    assert (await cache.lookup(scope(None), KEY, POLICY)).entry is None
    assert (await cache.lookup(scope("alpha", shared=True), KEY, POLICY)).entry is None
    await put(cache, scope("beta"), KEY, answer("beta's"))
    assert b"alpha's" in (await cache.lookup(scope("alpha"), KEY, POLICY)).entry.body
    assert b"beta's" in (await cache.lookup(scope("beta"), KEY, POLICY)).entry.body
    # shared: true puts every team in one scope.
    await put(cache, scope("alpha", shared=True), KEY, answer("shared"))
    assert b"shared" in (await cache.lookup(scope("gamma", shared=True), KEY, POLICY)).entry.body


async def test_entries_expire_after_ttl(
    cache: ResponseCache, redis_client: redis.asyncio.Redis
) -> None:
    short = CachePolicy(ttl_s=1)
    await put(cache, scope(), KEY, answer(), short)
    ttl_ms = await redis_client.pttl(cache.entry_key(scope(), KEY))
    assert 0 < ttl_ms <= 1000
    assert (await cache.lookup(scope(), KEY, short)).entry is not None
    await asyncio.sleep(1.1)
    assert (await cache.lookup(scope(), KEY, short)).entry is None
    assert (await cache.stats()).entries == 0


async def test_max_age_refuses_older_entries(cache: ResponseCache) -> None:
    ten_s_ago = time.time_ns() // 1_000_000 - 10_000
    await put(cache, scope(), KEY, answer(created_ms=ten_s_ago))
    assert (await cache.lookup(scope(), KEY, POLICY, max_age_s=60)).entry is not None
    assert (await cache.lookup(scope(), KEY, POLICY, max_age_s=5)).entry is None
    counters = (await cache.stats()).counters
    assert (counters["hit"], counters["miss"]) == (1, 2)  # the max-age refusal is a miss


async def test_a_scope_keeps_at_most_max_entries(
    cache: ResponseCache, redis_client: redis.asyncio.Redis
) -> None:
    few = CachePolicy(ttl_s=60, max_entries=3)
    for number in range(5):
        assert await put(cache, scope(), f"{number:064d}", answer(str(number)), few) == "stored"
    live = [
        number
        for number in range(5)
        if await redis_client.exists(cache.entry_key(scope(), f"{number:064d}"))
    ]
    assert live == [2, 3, 4]  # the ones closest to expiry went first, from Redis too
    assert (await cache.stats()).entries == 3


async def test_purge_by_model_and_by_team(cache: ResponseCache) -> None:
    where = [
        scope("alpha", "m1"),
        scope("alpha", "m2"),
        scope("beta", "m1"),
        scope(None, "m1"),
        scope("beta", "m2", shared=True),
    ]
    for place in where:
        for number in range(3):
            await put(cache, place, f"{number:064d}", answer())
    assert (await cache.stats()).entries == 15
    assert (await cache.stats(model="m1")).entries == 9
    assert (await cache.stats(team="alpha")).entries == 6

    purged = await cache.purge(model="m1", team="alpha")
    assert (purged.scopes, purged.entries) == (1, 3)
    purged = await cache.purge(model="m1")
    assert (purged.scopes, purged.entries) == (3, 6)  # beta, the team-less key; alpha's empty
    assert [(s.namespace, s.model) for s in (await cache.stats()).scopes if s.entries] == [
        ("shared", "m2"),
        ("team:alpha", "m2"),
    ]
    purged = await cache.purge(team="alpha")
    assert purged.entries == 3
    assert (await cache.lookup(scope("beta", "m2", shared=True), "0" * 64, POLICY)).entry
    purged = await cache.purge()
    assert purged.entries == 3 and (await cache.stats()).entries == 0


async def test_purge_is_batched_and_complete(cache: ResponseCache) -> None:
    many = 1234  # more than one purge batch
    for number in range(many):
        await cache.store(scope(), f"{number:064d}", answer(), POLICY, epoch=0)
    assert (await cache.stats()).entries == many
    assert (await cache.purge(team="alpha")).entries == many
    assert (await cache.stats()).entries == 0


async def test_an_answer_recorded_before_a_purge_is_not_stored_after_it(
    cache: ResponseCache,
) -> None:
    before = await cache.lookup(scope(), KEY, POLICY)  # a stream starts relaying...
    await put(cache, scope(), "b" * 64, answer())
    await cache.purge(model="fake-model")  # ...the operator purges meanwhile...
    assert await cache.store(scope(), KEY, answer(), POLICY, epoch=before.epoch) == "purged"
    assert (await cache.lookup(scope(), KEY, POLICY)).entry is None
    assert (await cache.stats()).counters["skip_purged"] == 1
    assert await put(cache, scope(), KEY, answer()) == "stored"  # later answers are stored


async def test_memory_is_bounded_every_cache_key_expires(
    cache: ResponseCache, redis_client: redis.asyncio.Redis
) -> None:
    await put(cache, scope("alpha"), KEY, answer())
    cache.note(scope("beta"), "bypass", POLICY)
    await cache.lookup(scope("gamma"), KEY, POLICY)
    await cache.purge(team="alpha")
    await cache.drain()
    keys = sorted([k.decode() async for k in redis_client.scan_iter("sy:*")])
    assert "sy:cache:scopes" in keys
    for key in keys:
        if key != "sy:cache:scopes":  # one member per scope, pruned when read
            assert await redis_client.pttl(key) > 0, key
    assert await redis_client.scard("sy:cache:scopes") == 3


async def test_stats_forget_scopes_whose_keys_expired(
    cache: ResponseCache, redis_client: redis.asyncio.Redis
) -> None:
    await put(cache, scope("alpha"), KEY, answer())
    await put(cache, scope("beta"), KEY, answer())
    await redis_client.delete(f"sy:{{cache:{scope('beta').id}}}:meta")  # as if expired
    stats = await cache.stats()
    assert [row.namespace for row in stats.scopes] == ["team:alpha"]
    assert await redis_client.smembers("sy:cache:scopes") == {scope("alpha").member}


def test_every_key_of_a_scope_is_in_one_cluster_slot(cache: ResponseCache) -> None:
    for place in (scope("alpha"), scope(None), scope("beta", "other", shared=True)):
        base = cache.entry_key(place, KEY).rsplit(":e:", 1)[0]
        names = [cache.entry_key(place, KEY), cache.entry_key(place, "b" * 64)]
        names += [f"{base}:index", f"{base}:meta"]
        assert len({key_slot(name.encode()) for name in names}) == 1


async def test_redis_down_is_cache_unavailable(own_redis: EmbeddedRedis) -> None:
    client = redis.asyncio.Redis.from_url(own_redis.url, socket_connect_timeout=0.5)
    cache = ResponseCache(client)
    try:
        await put(cache, scope(), KEY, answer())
        own_redis.stop()
        cache.note(scope(), "bypass", POLICY)  # buffered: never raises
        for call in (
            cache.lookup(scope(), KEY, POLICY),
            cache.store(scope(), KEY, answer(), POLICY, epoch=0),
            cache.flush_notes(),
            cache.stats(),
            cache.purge(),
        ):
            with pytest.raises(CacheUnavailable):
                await call
        own_redis.start()
        await cache.flush_notes()  # the counts kept through the outage arrive
        assert (await cache.stats()).counters["bypass"] == 1
    finally:
        await cache.drain()
        await client.aclose()


async def test_counts_without_a_lookup_are_written_in_one_batch_soon(
    cache: ResponseCache, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "NOTE_FLUSH_S", 0.05)
    meta = f"sy:{{cache:{scope().id}}}:meta"
    for _ in range(3):
        cache.note(scope(), "bypass", POLICY)
    cache.note(scope(), "skip_no_store", CachePolicy(ttl_s=7 * 86_400))
    assert await redis_client.exists(meta) == 0  # nothing written per request
    for _ in range(100):
        await asyncio.sleep(0.02)
        if await redis_client.exists(meta):
            break
    counts = await redis_client.hmget(meta, "bypass", "skip_no_store", "namespace", "model")
    assert counts == [b"3", b"1", b"team:alpha", b"fake-model"]
    assert await redis_client.pttl(meta) > 6 * 86_400_000  # the longest TTL noted
    assert await redis_client.sismember("sy:cache:scopes", scope().member)
