"""The usage recorder against a real Redis and a real usage store: events go to the buffer in the
caller's round trip, reach the store once each, and survive outages through the spool."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis
from usage_events import expected_groups, make_events, pick

from gateway.ledger import UsageError, UsageEvent, UsageStore
from gateway.metering.buffer import UsageBuffer
from gateway.metering.exporter import UsageExporter
from gateway.metering.recorder import RecordOutcome, UsageRecorder
from gateway.metering.reports import UsageReports
from gateway.metering.spool import Segment, Spool
from gateway.money import usd_to_nanos
from gateway.store.embedded import EmbeddedRedis
from gateway.store.scripts import ScriptBatch


def event(request_id: str = "req-1", **overrides: object) -> UsageEvent:
    fields: dict[str, object] = {
        "event_id": request_id,
        "time_ms": int(time.time() * 1000),
        "key_id": "key-a",
        "model": "gpt-4.1-mini",
        "provider": "openai",
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "cost_nanos": 123_456,
    }
    fields.update(overrides)
    return UsageEvent(**fields)  # type: ignore[arg-type]


def on_redis(client: Redis, store: UsageStore, spool_dir: Path, **options: float) -> UsageRecorder:
    """A recorder on another Redis client (a private server), feeding ``store``."""
    buffer = UsageBuffer(client)
    buffer.bind(store.store_id)
    return UsageRecorder(buffer, spool=Spool(spool_dir), **options)  # type: ignore[arg-type]


async def test_same_request_id_is_stored_once(
    recorder: UsageRecorder, exporter: UsageExporter, reports: UsageReports, redis_client: Redis
) -> None:
    assert await recorder.record(event()) is RecordOutcome.RECORDED
    # A retry of the same request with other numbers goes to the buffer too: the store keeps
    # the first copy only.
    assert await recorder.record(event(prompt_tokens=999)) is RecordOutcome.RECORDED
    assert (await recorder.buffer.stats()).backlog == 2
    assert await exporter.drain() == 2
    usage = await reports.usage_for_key("key-a", days=1)
    assert usage["requests"] == 1
    assert usage["prompt_tokens"] == 100
    assert usage["total_cost_nanos"] == 123_456
    assert usage["total_cost"] == 0.000123456
    assert usage["pending_export"] == 0
    # Nothing of the request is left in Redis: the shard streams (and their group) only.
    assert await redis_client.dbsize() == len(recorder.buffer.keys)
    assert all([await redis_client.xlen(key) == 0 for key in recorder.buffer.keys])


async def test_record_shares_a_callers_round_trip(
    recorder: UsageRecorder, exporter: UsageExporter, reports: UsageReports, redis_client: Redis
) -> None:
    """The limiter's settle and the record go into one batch: one round trip."""
    batch = ScriptBatch()
    batch.command("INCRBY", "sy:{key:key-a}:limits:tokens", 120)  # stands in for a settle
    position = recorder.queue_record(batch, event("req-shared"))
    batch.command("INCRBY", "sy:{key:key-a}:limits:cost", 7)  # queued after: still fine
    replies = await batch.execute(redis_client)
    assert replies[0] == 120 and replies[-1] == 7
    assert replies[position].count(b"-") == 1  # the buffer entry's id
    await exporter.drain()
    assert (await reports.usage_for_key("key-a", days=1))["requests"] == 1


async def test_reports_equal_event_sums_with_replays_and_two_exporters(
    recorder: UsageRecorder,
    exporter: UsageExporter,
    usage_buffer: UsageBuffer,
    usage_store: UsageStore,
    reports: UsageReports,
) -> None:
    events = make_events(600, seed=7)
    # Every 10th event is sent again concurrently with its original: a gateway retry.
    replays = events[::10]
    second = UsageExporter(
        usage_buffer, usage_store, exporter.settings, exporter.metrics, exporter.log
    )

    async def export_while_recording() -> None:
        for _ in range(50):
            await asyncio.gather(exporter.export_once(), second.export_once())
            await asyncio.sleep(0.005)

    outcomes, _ = await asyncio.gather(
        asyncio.gather(*(recorder.record(e) for e in [*events, *replays])),
        export_while_recording(),
    )
    assert set(outcomes) == {RecordOutcome.RECORDED}
    await asyncio.gather(exporter.drain(), second.drain())
    assert (await usage_buffer.stats()).backlog == 0

    start = min(e.day for e in events)
    end = max(e.day for e in events)
    for by in ("key", "team", "model", "provider", "task", "day"):
        report = await reports.admin_usage(start, end, by)
        got = {row[by]: pick(row) for row in report["data"] if row["requests"]}
        want = expected_groups(events, by)
        assert got.keys() == want.keys(), by
        for name, row in want.items():
            assert got[name] == row, (by, name)
        assert report["totals"]["cost_nanos"] == sum(e.cost_nanos for e in events)
        assert report["totals"]["cost"] == sum(e.cost_nanos for e in events) / 1_000_000_000


async def test_event_validation_names_the_field() -> None:
    cases = {
        "event_id": {"event_id": ""},
        "key_id": {"key_id": "a{b}"},
        "prompt_tokens": {"prompt_tokens": -1},
        "cached_tokens": {"cached_tokens": 101},
        "status": {"status": 42},
        "usage_source": {"usage_source": "guessed"},
        "cost_nanos": {"cost_nanos": -1},
        "streamed": {"streamed": "yes"},
    }
    for field, overrides in cases.items():
        with pytest.raises(UsageError) as caught:
            event(**overrides)
        assert caught.value.field == field
    with pytest.raises(UsageError) as caught:
        UsageEvent.from_json(b'{"time": 1, "request_id": "r", "bogus": 1}')
    assert caught.value.field == "bogus"
    # The JSON form names the fields it names otherwise in its own terms.
    with pytest.raises(UsageError) as caught:
        UsageEvent.from_dict({**event().to_dict(), "request_id": ""})
    assert caught.value.field == "request_id"
    with pytest.raises(UsageError) as caught:
        UsageEvent.from_dict({**event().to_dict(), "time": "noon"})
    assert caught.value.field == "time"
    # cost_usd is only a rendering of the integer: read JSON re-derives it, never rounds it in.
    assert UsageEvent.from_dict({**event(cost_nanos=0).to_dict(), "cost_usd": 2.5e-6}).cost_usd == 0
    assert usd_to_nanos(0.0000025) == 2500  # exact from the decimal text: no float artefact
    assert event(cost_nanos=2500).cost_usd == 0.0000025
    # An event recorded before nano-dollars (a spool line, a stream entry) reads x1000.
    legacy = event().to_dict()
    legacy.pop("cost_nanos")
    legacy.update(cost_micros=7, cost_usd=7e-6)
    assert UsageEvent.from_dict(legacy).cost_nanos == 7000
    original = event(ttft_ms=12, streamed=True, usage_source="estimated")
    assert UsageEvent.from_json(original.to_json()) == original
    # The JSON's time in epoch seconds reads back to the same millisecond, also for times
    # (2004, 2038) whose ``time_ms / 1000`` would read back as one less.
    for time_ms in (1_084_202_825_932, 1_700_000_000_123, 2_152_570_672_398, 2_163_418_283_996):
        assert int(time_ms / 1000 * 1000) != time_ms or time_ms == 1_700_000_000_123
        assert UsageEvent.from_json(event(time_ms=time_ms).to_json()).time_ms == time_ms


async def test_outage_spools_and_replay_counts_each_event_once(
    own_redis: EmbeddedRedis, usage_store: UsageStore, tmp_path: Path
) -> None:
    client = Redis.from_url(own_redis.url, socket_connect_timeout=1, socket_timeout=2)
    spool = Spool(tmp_path / "spool")
    recorder = on_redis(client, usage_store, tmp_path / "spool")
    exporter = UsageExporter(recorder.buffer, usage_store, *_exporter_parts())
    reports = UsageReports(usage_store, recorder.buffer)
    events = make_events(120, seed=11, days=1)
    try:
        for e in events[:40]:
            assert await recorder.record(e) is RecordOutcome.RECORDED
        own_redis.kill()
        outcomes = await asyncio.gather(*(recorder.record(e) for e in events[40:]))
        assert set(outcomes) == {RecordOutcome.SPOOLED}
        assert recorder.spool_depth() == 80
        with pytest.raises(Exception):  # noqa: B017 - any Redis error: still down
            await recorder.replay_spool()
        assert recorder.spool_depth() == 80  # nothing truncated by a failed replay

        own_redis.start()
        # Keep a copy of the frozen segment to replay it again as if the first run had died
        # just before truncating.
        async with spool.replaying() as segments:
            saved = [(s.path, s.path.read_bytes()) for s in segments]
        assert await recorder.replay_spool() == 80
        assert recorder.spool_depth() == 0
        for path, data in saved:
            path.write_bytes(data)
        assert recorder.spool_depth() == 80
        assert await recorder.replay_spool() == 80  # in the buffer again ...
        assert await exporter.drain() == 200
        day = events[0].day
        for by in ("key", "model"):  # ... and stored once
            report = await reports.admin_usage(day, day, by)
            assert {row[by]: pick(row) for row in report["data"]} == expected_groups(events, by)
        assert report["pending_export"] == 0
    finally:
        await client.aclose()


def _exporter_parts() -> tuple[object, ...]:
    import structlog

    from gateway.metrics import Metrics
    from gateway.settings import ExportSettings

    return ExportSettings(), Metrics(), structlog.get_logger()


async def test_torn_spool_line_is_kept_aside_not_replayed_forever(
    recorder: UsageRecorder, exporter: UsageExporter, reports: UsageReports
) -> None:
    good = event("req-good")
    recorder.spool.append_sync(good.to_json())
    recorder.spool.append_sync(b'{"time": 17, "request_id": "req-torn", "key_')
    assert recorder.spool_depth() == 2
    assert await recorder.replay_spool() == 1
    assert recorder.spool_depth() == 0
    assert b"req-torn" in recorder.spool.rejected_path.read_bytes()
    await exporter.drain()
    assert (await reports.usage_for_key("key-a", days=1))["requests"] == 1


async def test_background_task_replays_when_redis_returns(
    own_redis: EmbeddedRedis, usage_store: UsageStore, tmp_path: Path
) -> None:
    client = Redis.from_url(own_redis.url, socket_connect_timeout=1, socket_timeout=2)
    recorder = on_redis(client, usage_store, tmp_path / "spool", replay_interval_s=0.1)
    await recorder.start()
    try:
        own_redis.kill()
        assert await recorder.record(event("req-bg")) is RecordOutcome.SPOOLED
        await asyncio.sleep(0.3)  # a few failed attempts while Redis is down
        assert recorder.spool_depth() == 1
        own_redis.start()
        deadline = time.monotonic() + 15
        while recorder.spool_depth() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert recorder.spool_depth() == 0
        assert (await recorder.buffer.stats()).backlog == 1
    finally:
        await recorder.stop()
        await client.aclose()


async def test_the_usage_spool_is_replayed_after_a_round_that_raised(
    redis_client: Redis, usage_store: UsageStore, tmp_path: Path
) -> None:
    recorder = on_redis(redis_client, usage_store, tmp_path / "spool", replay_interval_s=0.05)
    recorder.spool.append_sync(event("req-after-a-bad-round").to_json())
    parse = recorder._parse_segment
    raised: list[str] = []

    def fails_once(segment: Segment) -> list[UsageEvent]:
        if not raised:
            raised.append("once")
            raise RuntimeError("a bug in one round")
        return parse(segment)

    recorder._parse_segment = fails_once  # type: ignore[method-assign]
    await recorder.start()
    try:
        deadline = time.monotonic() + 10
        while recorder.spool_depth() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        await recorder.stop()
    assert raised == ["once"]
    assert recorder.spool_depth() == 0
    assert (await recorder.buffer.stats()).backlog == 1


async def test_spool_shared_by_two_writers_loses_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    other = Spool(tmp_path / "spool")  # a second gateway process on the same DATA_DIR
    lines = [f'{{"n": {i}}}'.encode() for i in range(200)]
    await asyncio.gather(
        *(s.append(line) for s, line in zip([spool, other] * 100, lines, strict=True))
    )
    async with spool.replaying() as segments:
        got = sorted(line for s in segments for line in s.lines())
        async with other.replaying() as concurrent:
            assert concurrent == []  # one replayer at a time
    assert got == sorted(lines)
    shutil.rmtree(tmp_path / "spool")


async def test_redis_and_disk_both_failing_is_reported_not_raised(
    own_redis: EmbeddedRedis, usage_store: UsageStore, tmp_path: Path
) -> None:
    client = Redis.from_url(own_redis.url, socket_connect_timeout=1, socket_timeout=2)
    spool_dir = tmp_path / "spool"
    recorder = on_redis(client, usage_store, spool_dir)
    try:
        own_redis.kill()
        shutil.rmtree(spool_dir)
        spool_dir.write_text("not a directory")  # the disk path is broken too
        assert await recorder.record(event("req-lost")) is RecordOutcome.LOST
    finally:
        await client.aclose()


async def test_settle_and_record_share_one_round_trip_with_the_real_limiter(
    recorder: UsageRecorder, exporter: UsageExporter, reports: UsageReports, redis_client: Redis
) -> None:
    from gateway.metering.limits import KeyLimits, Limiter

    limiter = Limiter(redis_client)
    limits = KeyLimits(rpm=100, tpm=100_000, budget_nanos=usd_to_nanos(10.0))
    reservation = await limiter.reserve(
        "key-a", limits, tokens=500, cost_nanos=usd_to_nanos(0.01), request_id="req-limited"
    )
    used = event("req-limited", prompt_tokens=100, completion_tokens=20, cost_nanos=123_456)
    batch = ScriptBatch()
    limiter.queue_settle(batch, reservation, tokens=used.total_tokens, cost_nanos=used.cost_nanos)
    recorder.queue_record(batch, used)
    replies = await batch.execute(redis_client)
    assert len(replies) == 2  # one settle, one record: one round trip
    status = await limiter.status("key-a", limits)
    assert status["tokens"]["used"] == used.total_tokens  # the estimate of 500 was replaced
    assert status["budget"]["spent_nanos"] == used.cost_nanos == 123_456
    await exporter.drain()
    assert (await reports.usage_for_key("key-a", days=1))["total_cost_nanos"] == 123_456
