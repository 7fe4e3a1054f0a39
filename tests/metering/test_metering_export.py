"""The exporter between a real Redis and real usage stores (SQLite, and PostgreSQL where the
point is the server): Redis left with nothing per request, entries of a dead consumer claimed,
a store outage retried without loss, metrics, groups lost with Redis's data, unreadable
entries, one buffer per store, and retention applied at start in both stores."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from usage_events import make_events

from gateway.ledger import EventQuery, RollupQuery, UsageStore, open_store
from gateway.metering.buffer import FIELD, UsageBuffer
from gateway.metering.exporter import ExportFailed, ExportSettings, UsageExporter
from gateway.metering.ledger import UsageEvent, UsageLedger, day_of
from gateway.metering.reports import UsageReports
from gateway.metering.spool import Spool
from gateway.metrics import Metrics
from gateway.store.scripts import ScriptBatch


def exporter_of(buffer: UsageBuffer, store: UsageStore, **settings: float) -> UsageExporter:
    return UsageExporter(
        buffer, store, ExportSettings(**settings), Metrics(), structlog.get_logger()
    )


def buffer_on(redis: Redis, store: UsageStore) -> UsageBuffer:
    buffer = UsageBuffer(redis)
    buffer.bind(store.store_id)
    return buffer


async def record(buffer: UsageBuffer, events: list[UsageEvent]) -> None:
    batch = ScriptBatch()
    for event in events:
        buffer.queue_append(batch, event.request_id, event.to_json())
    await batch.execute(buffer.redis)


def samples(metrics: Metrics) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            outcome = sample.labels.get("outcome") or sample.labels.get("stage")
            values[sample.name + (f":{outcome}" if outcome else "")] = sample.value
    return values


async def test_redis_keeps_nothing_per_request_once_exported(
    usage_buffer: UsageBuffer,
    exporter: UsageExporter,
    reports: UsageReports,
    redis_client: Redis,
) -> None:
    await usage_buffer.ensure_groups()
    keys_before = await redis_client.dbsize()
    memory_before = (await redis_client.info("memory"))["used_memory"]
    events = make_events(3000, seed=21, days=2)
    for start in range(0, len(events), 500):
        await record(usage_buffer, events[start : start + 500])
    assert (await usage_buffer.stats()).backlog == 3000
    assert await exporter.drain() == 3000

    assert await redis_client.dbsize() == keys_before == usage_buffer.shards
    stats = await usage_buffer.stats()
    assert (stats.backlog, stats.pending, stats.oldest_ms) == (0, 0, None)
    grown = (await redis_client.info("memory"))["used_memory"] - memory_before
    # Far below one event's JSON (~400 bytes) per event: what is left is allocator slack.
    assert grown < 3000 * 10, grown
    report = await reports.admin_usage(day_of(time.time()) - timedelta(days=1), reports.today())
    assert report["totals"]["requests"] == 3000 and report["pending_export"] == 0
    assert report["totals"]["cost_nanos"] == sum(e.cost_nanos for e in events)


async def test_a_killed_consumers_entries_are_claimed_and_stored_once(
    usage_buffer: UsageBuffer, usage_store: UsageStore, reports: UsageReports
) -> None:
    events = make_events(200, seed=22, days=1)
    await record(usage_buffer, events)
    await usage_buffer.ensure_groups()
    # A replica read these, then was killed before storing them: they stay pending under it.
    taken = await usage_buffer.read("killed-replica", 120)
    assert len(taken) >= 100
    survivor = exporter_of(usage_buffer, usage_store, claim_idle_s=0.3)
    assert await survivor.drain() == 200 - len(taken)  # the rest; the taken ones are not free
    assert (await usage_buffer.stats()).pending == len(taken)
    await asyncio.sleep(0.35)
    assert await survivor.export_once(claim=True) == len(taken)  # idle long enough: claimed
    stats = await usage_buffer.stats()
    assert (stats.backlog, stats.pending) == (0, 0)
    # The killed replica's late acknowledgement (had it lived) changes nothing.
    assert await usage_buffer.acknowledge(taken) == 0
    today = reports.today()
    report = await reports.admin_usage(today - timedelta(days=1), today, "key")
    assert report["totals"]["requests"] == 200
    assert report["totals"]["cost_nanos"] == sum(e.cost_nanos for e in events)


async def test_a_store_outage_keeps_the_events_in_redis_and_loses_none(
    redis_client: Redis, postgres_url: str, postgres_server_url: str, tmp_path: Path
) -> None:
    store = await open_store(postgres_url, data_dir=tmp_path)
    admin = await asyncpg.connect(postgres_server_url)
    database = postgres_url.rsplit("/", 1)[1]
    try:
        buffer = buffer_on(redis_client, store)
        exporter = exporter_of(buffer, store)
        first, second = make_events(150, seed=23, days=1), make_events(50, seed=24, days=1)
        await record(buffer, first)
        # The database refuses connections and drops the open ones: an outage of the store.
        await admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database
        )
        with pytest.raises(ExportFailed) as failed:
            await exporter.export_once()
        assert failed.value.stage == "store"
        await record(buffer, second)  # requests go on meanwhile
        with pytest.raises(ExportFailed):
            await exporter.export_once()  # the same batch again, first
        assert (await buffer.stats()).backlog == 200  # all still in Redis
        await admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
        assert await exporter.drain() == 200
        page = await store.list_events(EventQuery(limit=1000))
        assert sorted(e.event_id for e in page.events) == sorted(
            e.request_id for e in first + second
        )
        assert (await buffer.stats()).backlog == 0
    finally:
        await admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
        await admin.close()
        await store.close()


async def test_metrics_show_backlog_lag_and_outcomes(
    usage_buffer: UsageBuffer, exporter: UsageExporter, redis_client: Redis
) -> None:
    await usage_buffer.ensure_groups()
    await record(usage_buffer, make_events(5, seed=25, days=1))
    # An entry no version could read: rejected (logged in full), not claimed forever.
    await redis_client.xadd(usage_buffer.keys[3], {FIELD: b'{"not": "an event"}'})
    await asyncio.sleep(0.05)
    await exporter.refresh_stats()
    before = samples(exporter.metrics)
    assert before["switchyard_usage_export_backlog"] == 6
    assert before["switchyard_usage_export_lag_seconds"] >= 0.04
    assert await exporter.drain() == 6
    await exporter.refresh_stats()
    after = samples(exporter.metrics)
    assert after["switchyard_usage_export_backlog"] == 0
    assert after["switchyard_usage_export_pending"] == 0
    assert after["switchyard_usage_export_lag_seconds"] == 0
    assert after["switchyard_usage_exported_total:inserted"] == 5
    assert after["switchyard_usage_exported_total:rejected"] == 1
    assert after["switchyard_usage_export_batch_seconds_count"] == 1


async def test_export_goes_on_after_redis_lost_the_groups(
    usage_buffer: UsageBuffer, exporter: UsageExporter, redis_client: Redis
) -> None:
    await record(usage_buffer, make_events(10, seed=26, days=1))
    assert await exporter.drain() == 10
    await redis_client.flushall()  # Redis restarted without its data, groups and all
    await record(usage_buffer, make_events(10, seed=27, days=1))
    assert await exporter.drain() == 10
    assert (await usage_buffer.stats()).backlog == 0


async def test_the_background_exporter_keeps_up_and_leaves_its_group(
    usage_buffer: UsageBuffer, usage_store: UsageStore, redis_client: Redis, tmp_path: Path
) -> None:
    exporter = exporter_of(usage_buffer, usage_store, interval_s=0.02, stats_interval_s=0.02)
    ledger = UsageLedger(usage_buffer, spool=Spool(tmp_path / "spool"))
    await exporter.start()
    try:
        for event in make_events(40, seed=28, days=1):
            await ledger.record(event)
        deadline = time.monotonic() + 10
        while (await usage_buffer.stats()).backlog and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert (await usage_buffer.stats()).backlog == 0
    finally:
        await exporter.stop()
    consumers = [
        info["name"]
        for key in usage_buffer.keys
        for info in await redis_client.xinfo_consumers(key, "export")
    ]
    assert exporter.consumer.encode() not in consumers  # it left the group on a clean stop
    page = await usage_store.list_events(EventQuery(limit=100))
    assert len(page.events) == 40


async def test_each_store_gets_only_its_own_replicas_events(
    redis_client: Redis, tmp_path: Path
) -> None:
    """Two replicas on one Redis, each with its own SQLite file: two buffers, no mixing."""
    stores = [await open_store("", data_dir=tmp_path / name) for name in ("a", "b")]
    try:
        assert stores[0].store_id != stores[1].store_id
        buffers = [buffer_on(redis_client, store) for store in stores]
        events = make_events(60, seed=29, days=1)
        await record(buffers[0], events[:25])
        await record(buffers[1], events[25:])
        exporters = [exporter_of(b, s) for b, s in zip(buffers, stores, strict=True)]
        assert await exporters[1].drain() == 35
        assert await exporters[0].drain() == 25
        for store, part in zip(stores, (events[:25], events[25:]), strict=True):
            page = await store.list_events(EventQuery(limit=100))
            assert {e.event_id for e in page.events} == {e.request_id for e in part}
    finally:
        for store in stores:
            await store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend: a SQLite file, a database on the scratch PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'usage.sqlite3'}"
    return request.getfixturevalue("postgres_url")


async def test_retention_at_start_empties_old_days_in_the_store_and_redis(
    store_url: str, redis_client: Redis, tmp_path: Path
) -> None:
    url = store_url
    today = day_of(time.time())
    by_age = {age: make_events(20, seed=30 + age, days=1) for age in (0, 1, 2, 3, 6)}
    for age, events in by_age.items():  # each group moved back ``age`` days
        by_age[age] = [
            UsageEvent.from_dict({**e.to_dict(), "time": e.time - age * 86_400}) for e in events
        ]
    kept_days = RollupQuery(today - timedelta(days=2), today + timedelta(days=1), ("day", "key"))
    wide = await open_store(url, data_dir=tmp_path, retention_days=10)
    await wide.insert([e.to_ledger() for events in by_age.values() for e in events])
    kept_before = await wide.rollup(kept_days)
    await wide.close()

    store = await open_store(url, data_dir=tmp_path, retention_days=3)
    try:
        buffer = buffer_on(redis_client, store)
        # Late arrivals: a spooled event from 5 days ago replayed only now, and one of today.
        late_old = UsageEvent.from_dict({**by_age[6][0].to_dict(), "request_id": "late-old"})
        await record(buffer, [late_old])
        exporter = exporter_of(buffer, store, interval_s=0.02)
        await exporter.start()  # maintain() runs first: the window is now 3 days
        deadline = time.monotonic() + 10
        while (await buffer.stats()).backlog and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await exporter.stop()

        page = await store.list_events(EventQuery(limit=1000))
        cutoff = today - timedelta(days=2)
        assert {day_of(e.time_ms / 1000) for e in page.events} == {
            today - timedelta(days=age) for age in (0, 1, 2)
        }
        assert len(page.events) == 60 and "late-old" not in {e.event_id for e in page.events}
        old = RollupQuery(today - timedelta(days=30), cutoff, ("day",))
        assert await store.rollup(old) == []
        assert await store.rollup(kept_days) == kept_before  # kept days: unchanged
        assert (await buffer.stats()).backlog == 0  # the late old one left Redis too
        if store.kind == "postgresql":
            assert min(await store.partitions()) >= cutoff  # old partitions dropped
    finally:
        await store.close()
