"""Issue 19: the response cache on a 3-master Redis Cluster: every script keeps a scope's keys
in one slot, and stats and purge read scopes spread over every master."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis_helpers import LoopbackCluster

from gateway.cache import CacheEntry, CacheScope, ResponseCache
from gateway.policy import CachePolicy
from gateway.store.connect import connect_redis

POLICY = CachePolicy(ttl_s=60, max_entries=2)


@pytest.fixture
async def cache(cluster: LoopbackCluster) -> AsyncIterator[ResponseCache]:
    client = connect_redis(cluster.url, timeout_s=2.0)
    assert isinstance(client, RedisCluster)
    cache = ResponseCache(client, prefix="sy-cache-test")
    yield cache
    await cache.purge()
    await cache.drain()
    await client.aclose()


async def test_the_cache_runs_on_a_cluster(cache: ResponseCache, cluster: LoopbackCluster) -> None:
    scopes = [
        CacheScope.of(model=f"m{i % 3}", team=f"team{i}", key_id="k", shared=False)
        for i in range(12)
    ]
    masters = {cluster.owner_of(cache.entry_key(scope, "0" * 64)).port for scope in scopes}
    assert masters == {node.port for node in cluster.nodes}
    now = time.time_ns() // 1_000_000
    for scope in scopes:
        for number in range(3):  # one past max_entries: the drop deletes on the right node
            key = f"{number:064d}"
            looked = await cache.lookup(scope, key, POLICY)
            assert looked.entry is None
            entry = CacheEntry("json", scope.model, "p", created_ms=now, body=b"{}")
            assert await cache.store(scope, key, entry, POLICY, epoch=looked.epoch) == "stored"
        assert (await cache.lookup(scope, f"{2:064d}", POLICY)).entry is not None
        cache.note(scope, "bypass", POLICY)
    await cache.drain()
    stats = await cache.stats()
    assert len(stats.scopes) == 12 and stats.entries == 24
    counters = stats.counters
    assert (counters["hit"], counters["miss"], counters["store"], counters["bypass"]) == (
        12,
        36,
        36,
        12,
    )
    purged = await cache.purge(model="m1")
    assert (purged.scopes, purged.entries) == (4, 8)
    assert (await cache.stats()).entries == 16
