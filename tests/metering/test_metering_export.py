"""The exporter between a real Redis and real usage stores (SQLite, and PostgreSQL where the
point is the server): Redis left with nothing per request, entries of a dead consumer claimed,
a store outage retried without loss, metrics, groups lost with Redis's data, unreadable
entries, one buffer per store, and retention applied at start in both stores."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from datetime import timedelta
from pathlib import Path

import asyncpg
import orjson
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from usage_events import make_events

from gateway.ledger import EventQuery, RollupQuery, UsageEvent, UsageStore, open_store
from gateway.ledger.event import day_of
from gateway.metering import exporter as exporter_module
from gateway.metering.buffer import FIELD, UsageBuffer
from gateway.metering.exporter import DECODE_SLICE_S, ExportFailed, UsageExporter
from gateway.metering.recorder import UsageRecorder
from gateway.metering.reports import UsageReports
from gateway.metering.spool import Spool
from gateway.metrics import Metrics
from gateway.settings import ExportSettings
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
        buffer.queue_append(batch, event.event_id, event.to_json())
    await batch.execute(buffer.redis)


def samples(metrics: Metrics) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            outcome = sample.labels.get("outcome") or sample.labels.get("stage")
            values[sample.name + (f":{outcome}" if outcome else "")] = sample.value
    return values


# Two events as the gateway wrote them to the buffer before the usage event was one model
# (``metering/ledger.py`` UsageEvent, then ``to_ledger``): a replica of that version may still
# have some buffered, or spooled, during an upgrade.
BUFFERED_BEFORE = (
    b'{"time":1764590400.1234567,"request_id":"req-before-1","key_id":"key-old",'
    b'"model":"gpt-4.1-mini","provider":"openai","team":"search","task":"chat",'
    b'"route":"primary","prompt_tokens":1200,"completion_tokens":340,"cached_tokens":200,'
    b'"cost_nanos":1234567891,"cost_usd":1.234567891,"cache_write_tokens":100,'
    b'"policy_version":"v7","latency_ms":812,"ttft_ms":95,"status":200,"streamed":true,'
    b'"usage_source":"provider","attempts":2,"end_user":"ana","tags":["proj-x","exp:1"]}',
    b'{"time":1764633599.9996,"request_id":"req-before-2","key_id":"key-old","model":"m",'
    b'"provider":"p","team":"","task":"","route":"","prompt_tokens":0,"completion_tokens":0,'
    b'"cached_tokens":0,"cost_nanos":0,"cost_usd":0.0,"cache_write_tokens":0,'
    b'"policy_version":"","latency_ms":0,"ttft_ms":null,"status":429,"streamed":false,'
    b'"usage_source":"estimated","attempts":1,"end_user":"","tags":[]}',
)


async def test_events_buffered_by_the_previous_version_export_unchanged(
    redis_client: Redis, tmp_path: Path
) -> None:
    # Kept for a century: the events are of a fixed day, however long ago that is.
    store = await open_store(
        f"sqlite:///{tmp_path / 'usage.sqlite3'}", data_dir=tmp_path, retention_days=36_500
    )
    buffer = buffer_on(redis_client, store)
    batch = ScriptBatch()
    for payload in BUFFERED_BEFORE:
        buffer.queue_append(batch, orjson.loads(payload)["request_id"], payload)
    await batch.execute(redis_client)
    try:
        assert await exporter_of(buffer, store).drain() == 2
        stored = {e.event_id: e for e in (await store.list_events(EventQuery())).events}
    finally:
        await store.close()
    # What that version's ``to_ledger`` made of them, field for field.
    assert stored["req-before-1"] == UsageEvent(
        event_id="req-before-1",
        time_ms=1764590400123,
        key_id="key-old",
        model="gpt-4.1-mini",
        provider="openai",
        team="search",
        task="chat",
        route="primary",
        prompt_tokens=1200,
        completion_tokens=340,
        cached_tokens=200,
        cache_write_tokens=100,
        cost_nanos=1234567891,
        status=200,
        streamed=True,
        usage_source="provider",
        attempts=2,
        latency_ms=812,
        ttft_ms=95,
        policy_version="v7",
        end_user="ana",
        tags=("proj-x", "exp:1"),
    )
    late = stored["req-before-2"]  # the last millisecond of its day, still on that day
    assert (late.time_ms, late.status, late.usage_source) == (1764633599999, 429, "estimated")
    assert late.day.isoformat() == "2025-12-01"
    # Written again today: the same keys in the same order, the same values, and a time that
    # reads back to the same millisecond in that version's reader (``int(time * 1000)``).
    for payload in BUFFERED_BEFORE:
        before = orjson.loads(payload)
        event = UsageEvent.from_json(payload)
        now = orjson.loads(event.to_json())
        assert list(now) == list(before)
        assert {k: v for k, v in now.items() if k != "time"} == {
            k: v for k, v in before.items() if k != "time"
        }
        assert int(now["time"] * 1000) == int(before["time"] * 1000) == event.time_ms


async def test_redis_keeps_nothing_per_request_once_exported(
    usage_buffer: UsageBuffer,
    exporter: UsageExporter,
    reports: UsageReports,
    redis_client: Redis,
) -> None:
    await usage_buffer.ensure_groups()
    # A first round pays what is paid once, not per request: the exporter's consumer in every
    # shard's group and the pool's connections (~55 KB together, which a test run alone saw).
    warm_up = make_events(100, seed=22, days=2)
    await record(usage_buffer, warm_up)
    assert await exporter.drain() == 100
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
    assert report["totals"]["requests"] == 3100 and report["pending_export"] == 0
    assert report["totals"]["cost_nanos"] == sum(e.cost_nanos for e in events + warm_up)


async def test_a_big_round_lets_requests_run_while_it_decodes(
    usage_buffer: UsageBuffer, exporter: UsageExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding a round of a thousand events takes about 10 ms; the event loop serves the
    requests in flight between slices of ``DECODE_SLICE_S`` of it instead of after. Each
    decode here takes at least half a slice, so no slice holds more than three (a slower box
    only ends its slices sooner)."""
    await usage_buffer.ensure_groups()
    await record(usage_buffer, make_events(1000, seed=5))
    decoded = 0
    real_decode = exporter_module.decode_entry

    def slow_decode(payload: bytes, *, known: UsageEvent | None = None) -> object:
        nonlocal decoded
        until = time.perf_counter() + DECODE_SLICE_S / 2
        while time.perf_counter() < until:
            pass
        decoded += 1
        return real_decode(payload, known=known)

    monkeypatch.setattr(exporter_module, "decode_entry", slow_decode)
    seen: list[int] = []  # how many were decoded each time the other task got a turn
    done = False

    async def other_request() -> None:
        while not done:
            seen.append(decoded)
            await asyncio.sleep(0)

    other = asyncio.create_task(other_request())
    try:
        handled = await exporter.export_once()  # a round: most of them (the shards' share)
    finally:
        done = True
        await other
    assert handled > 500
    during = sorted({n for n in seen if 0 < n < handled})
    assert len(during) >= handled // 3 - 1, during
    assert all(b - a <= 3 for a, b in itertools.pairwise(during)), during


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
        assert sorted(e.event_id for e in page.events) == sorted(e.event_id for e in first + second)
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
    recorder = UsageRecorder(usage_buffer, spool=Spool(tmp_path / "spool"))
    await exporter.start()
    try:
        for event in make_events(40, seed=28, days=1):
            await recorder.record(event)
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
            assert {e.event_id for e in page.events} == {e.event_id for e in part}
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
        by_age[age] = [dataclasses.replace(e, time_ms=e.time_ms - age * 86_400_000) for e in events]
    kept_days = RollupQuery(today - timedelta(days=2), today + timedelta(days=1), ("day", "key"))
    wide = await open_store(url, data_dir=tmp_path, retention_days=10)
    await wide.insert([e for events in by_age.values() for e in events])
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
