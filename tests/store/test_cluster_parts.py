"""The gateway's Redis parts, driven directly against a 3-master Redis Cluster.

Every multi-key script must keep its keys in one slot (the cluster refuses CROSSSLOT
otherwise), pipelines that span slots must still return replies in order, and the usage buffer's
shards, spread over every master, must all be exported. Each test uses ids spread over all three
masters.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import structlog
from redis.asyncio.cluster import RedisCluster
from redis_helpers import LoopbackCluster, settle_parts, settle_round

from gateway.access.auth import Authenticator
from gateway.access.keys import KeyStore, parse_key, record_key
from gateway.errors import AuthenticationFailed
from gateway.ledger import UsageEvent, UsageStore
from gateway.metering.exporter import UsageExporter
from gateway.metering.limits import KeyLimits
from gateway.metering.reports import UsageReports
from gateway.metrics import Metrics
from gateway.money import usd_to_nanos
from gateway.settings import AuthSettings, ExportSettings
from gateway.store.connect import connect_redis

PEPPER = b"cluster-test-pepper-0123456789"


def _masters_of(cluster: LoopbackCluster, keys: list[str]) -> set[int]:
    return {cluster.owner_of(key).port for key in keys}


async def test_settle_and_usage_pipeline_spans_slots(
    client: RedisCluster, cluster: LoopbackCluster, usage_store: UsageStore, tmp_path: Path
) -> None:
    limiter, recorder, settler = settle_parts(client, tmp_path / "spool", usage_store.store_id)
    assert _masters_of(cluster, list(recorder.buffer.keys)) == {n.port for n in cluster.nodes}
    key_ids = [f"parts{i:02d}" for i in range(12)]
    assert _masters_of(cluster, [record_key(k) for k in key_ids]) == {n.port for n in cluster.nodes}
    limits = KeyLimits(rpm=1000, tpm=100_000, budget_nanos=usd_to_nanos(10.0), budget_period="day")
    await settle_round(limiter, settler, key_ids, limits, "req")
    assert recorder.spool_depth() == 0  # nothing failed over to the spool
    # Settled: the estimate (100 tokens, $0.50) was replaced by what was used.
    status = await limiter.status(key_ids[5], limits)
    assert status["tokens"]["used"] == 15
    assert status["budget"]["reserved_nanos"] == 0
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.001)
    # Recording the same request again reaches the buffer, and the store keeps the first copy.
    again = UsageEvent(
        event_id="req-parts03",
        time_ms=int(time.time() * 1000),
        key_id="parts03",
        model="m",
        provider="p",
    )
    assert (await recorder.record(again)).value == "recorded"
    exporter = UsageExporter(
        recorder.buffer, usage_store, ExportSettings(), Metrics(), structlog.get_logger()
    )
    await recorder.buffer.ensure_groups()  # one group per shard, each on its own master
    assert await exporter.drain() == len(key_ids) + 1
    stats = await recorder.buffer.stats()
    assert (stats.backlog, stats.pending) == (0, 0)

    reports = UsageReports(usage_store, recorder.buffer)
    today = reports.today()
    report = await reports.admin_usage(today, today, "key")
    rows = {row["key"]: row for row in report["data"] if row["key"] in key_ids}
    assert len(rows) == len(key_ids)
    assert sum(row["completion_tokens"] for row in rows.values()) == sum(range(12))
    assert sum(row["cost_nanos"] for row in rows.values()) == sum(
        1_000_000 * (i + 1) for i in range(12)
    )
    events = await reports.events(limit=500)
    seen = {e["request_id"] for e in events["data"]}
    assert {f"req-{k}" for k in key_ids} <= seen


async def test_rotation_is_idempotent_and_revocation_reaches_the_cache(
    client: RedisCluster, cluster: LoopbackCluster
) -> None:
    store = KeyStore(client, PEPPER)
    watcher_store = KeyStore(connect_redis(cluster.url, timeout_s=2.0), PEPPER)
    # A cache TTL far beyond the test (and past the 1 s an operator may set, hence unchecked):
    # only the change feed can evict the entry in time.
    auth = Authenticator(watcher_store, AuthSettings.model_construct(cache_ttl_s=60))
    watcher = asyncio.create_task(auth.watch_changes(watcher_store.redis, structlog.get_logger()))
    try:
        created = [await store.create({"name": f"k{i}"}) for i in range(6)]
        assert len(_masters_of(cluster, [record_key(c.record.id) for c in created])) >= 2
        for item in created:
            key_id = item.record.id
            first = await store.rotate(key_id, 30, idempotency_key="rotate-once")
            replay = await store.rotate(key_id, 30, idempotency_key="rotate-once")
            assert first.status == "ok" and replay.status == "replay"
            assert first.created is not None and replay.created is not None
            assert first.created.key == replay.created.key
            # The old secret is still good during the grace period, and so is the new one.
            principal = await auth.authenticate(f"Bearer {item.key}")
            assert principal.key_id == key_id
            await auth.authenticate(f"Bearer {first.created.key}")
        await asyncio.sleep(0.3)  # the watcher has subscribed by now (it clears on subscribe)
        victim = created[-1]
        await auth.authenticate(f"Bearer {victim.key}")  # cached
        assert (await store.revoke(victim.record.id)) is not None
        deadline = time.monotonic() + 1.0
        while True:
            try:
                await auth.authenticate(f"Bearer {victim.key}")
            except AuthenticationFailed as exc:
                assert exc.code == "key_revoked"
                break
            assert time.monotonic() < deadline, "revocation did not reach the cached entry"
            await asyncio.sleep(0.02)
        parsed = parse_key(victim.key)
        assert parsed is not None
        page = await store.list(limit=500)
        listed = {record.id for record in page.records}
        assert {c.record.id for c in created} <= listed
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await watcher_store.redis.aclose()
