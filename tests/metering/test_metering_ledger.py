"""The ledger against a real Redis: idempotency, exact aggregates under concurrency, outages."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis
from usage_events import expected_groups, make_events, pick

from gateway.metering.ledger import (
    RecordOutcome,
    UsageError,
    UsageEvent,
    UsageLedger,
    marker_key,
)
from gateway.metering.reports import UsageReports
from gateway.metering.spool import Spool
from gateway.money import usd_to_nanos
from gateway.store.embedded import EmbeddedRedis


def event(request_id: str = "req-1", **overrides: object) -> UsageEvent:
    fields: dict[str, object] = {
        "time": time.time(),
        "request_id": request_id,
        "key_id": "key-a",
        "model": "gpt-4.1-mini",
        "provider": "openai",
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "cost_nanos": 123_456,
    }
    fields.update(overrides)
    return UsageEvent(**fields)  # type: ignore[arg-type]


async def test_same_request_id_is_counted_once(
    ledger: UsageLedger, reports: UsageReports, redis_client: Redis
) -> None:
    first = event()
    assert await ledger.record(first) is RecordOutcome.RECORDED
    # A retry of the same request with different numbers must not count again.
    assert await ledger.record(event(prompt_tokens=999)) is RecordOutcome.DUPLICATE
    usage = await reports.usage_for_key("key-a", days=1)
    assert usage["requests"] == 1
    assert usage["prompt_tokens"] == 100
    assert usage["total_cost_nanos"] == 123_456
    assert usage["total_cost"] == 0.000123456
    assert await redis_client.xlen("sy:{key:key-a}:usage:events") == 1
    ttl = await redis_client.ttl(marker_key("key-a", "req-1"))
    assert ttl >= ledger.retention_s


async def test_add_record_shares_a_callers_pipeline(
    ledger: UsageLedger, reports: UsageReports, redis_client: Redis
) -> None:
    """The limiter's settle and the record go into one pipeline: one round trip."""
    pipe = redis_client.pipeline(transaction=False)
    pipe.incrby("sy:{key:key-a}:limits:tokens", 120)  # stands in for Limiter.add_settle
    position = ledger.add_record(pipe, event("req-shared"))
    pipe.incrby("sy:{key:key-a}:limits:cost", 7)  # queued after the record: still fine
    outcome, replies = await ledger.commit(pipe, event("req-shared"), position)
    assert outcome is RecordOutcome.RECORDED
    assert replies[0] == 120 and replies[-1] == 7
    assert (await reports.usage_for_key("key-a", days=1))["requests"] == 1


async def test_aggregates_equal_event_sums_under_concurrency(
    ledger: UsageLedger, reports: UsageReports
) -> None:
    events = make_events(600, seed=7)
    # Every 10th event is sent again concurrently with its original: a gateway retry.
    replays = events[::10]
    outcomes = await asyncio.gather(*(ledger.record(e) for e in [*events, *replays]))
    assert outcomes.count(RecordOutcome.RECORDED) == len(events)
    assert outcomes.count(RecordOutcome.DUPLICATE) == len(replays)

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
        "request_id": {"request_id": ""},
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
    # cost_usd is only a rendering of the integer: setting it alone is refused, not rounded.
    with pytest.raises(UsageError) as caught:
        event(cost_nanos=0, cost_usd=0.0000025)
    assert caught.value.field == "cost_usd"
    assert usd_to_nanos(0.0000025) == 2500  # exact from the decimal text: no float artefact
    assert event(cost_nanos=2500).cost_usd == 0.0000025
    # An event recorded before nano-dollars (a spool line, a stream entry) reads x1000.
    legacy = event().to_dict()
    legacy.pop("cost_nanos")
    legacy.update(cost_micros=7, cost_usd=7e-6)
    assert UsageEvent.from_dict(legacy).cost_nanos == 7000
    original = event(ttft_ms=12, streamed=True, usage_source="estimated")
    assert UsageEvent.from_json(original.to_json()) == original


async def test_outage_spools_and_replay_is_exact_and_idempotent(
    own_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    client = Redis.from_url(own_redis.url, socket_connect_timeout=1, socket_timeout=2)
    spool = Spool(tmp_path / "spool")
    ledger = UsageLedger(client, spool=spool, retention_days=30)
    reports = UsageReports(client, retention_days=30)
    events = make_events(120, seed=11, days=1)
    try:
        for e in events[:40]:
            assert await ledger.record(e) is RecordOutcome.RECORDED
        own_redis.kill()
        outcomes = await asyncio.gather(*(ledger.record(e) for e in events[40:]))
        assert set(outcomes) == {RecordOutcome.SPOOLED}
        assert ledger.spool_depth() == 80
        with pytest.raises(Exception):  # noqa: B017 - any Redis error: still down
            await ledger.replay_spool()
        assert ledger.spool_depth() == 80  # nothing truncated by a failed replay

        own_redis.start()
        # Keep a copy of the frozen segment to replay it again as if the first run had died
        # just before truncating.
        async with spool.replaying() as segments:
            saved = [(s.path, s.path.read_bytes()) for s in segments]
        assert await ledger.replay_spool() == 80
        assert ledger.spool_depth() == 0
        for path, data in saved:
            path.write_bytes(data)
        assert ledger.spool_depth() == 80
        assert await ledger.replay_spool() == 0  # all duplicates
        assert ledger.spool_depth() == 0

        day = events[0].day
        for by in ("key", "model"):
            report = await reports.admin_usage(day, day, by)
            assert {row[by]: pick(row) for row in report["data"]} == expected_groups(events, by)
    finally:
        await client.aclose()


async def test_torn_spool_line_is_kept_aside_not_replayed_forever(
    ledger: UsageLedger, reports: UsageReports
) -> None:
    good = event("req-good")
    ledger.spool.append_sync(good.to_json())
    ledger.spool.append_sync(b'{"time": 17, "request_id": "req-torn", "key_')
    assert ledger.spool_depth() == 2
    assert await ledger.replay_spool() == 1
    assert ledger.spool_depth() == 0
    assert b"req-torn" in ledger.spool.rejected_path.read_bytes()
    assert (await reports.usage_for_key("key-a", days=1))["requests"] == 1


async def test_background_task_replays_when_redis_returns(
    own_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    client = Redis.from_url(own_redis.url, socket_connect_timeout=1, socket_timeout=2)
    ledger = UsageLedger(
        client, spool=Spool(tmp_path / "spool"), retention_days=30, replay_interval_s=0.1
    )
    await ledger.start()
    try:
        own_redis.kill()
        assert await ledger.record(event("req-bg")) is RecordOutcome.SPOOLED
        await asyncio.sleep(0.3)  # a few failed attempts while Redis is down
        assert ledger.spool_depth() == 1
        own_redis.start()
        deadline = time.monotonic() + 15
        while ledger.spool_depth() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert ledger.spool_depth() == 0
        reports = UsageReports(client, retention_days=30)
        assert (await reports.usage_for_key("key-a", days=1))["requests"] == 1
    finally:
        await ledger.stop()
        await client.aclose()


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


async def test_failing_neighbour_command_spools_without_double_count(
    ledger: UsageLedger, reports: UsageReports, redis_client: Redis
) -> None:
    """Another command in the shared pipeline fails: the event is spooled, and the replay
    finds it already counted (the script ran) rather than counting it twice."""
    await redis_client.hset("sy:{key:key-a}:limits:tokens", "x", 1)
    pipe = redis_client.pipeline(transaction=False)
    pipe.incrby("sy:{key:key-a}:limits:tokens", 5)  # WRONGTYPE
    position = ledger.add_record(pipe, event("req-neighbour"))
    outcome, _ = await ledger.commit(pipe, event("req-neighbour"), position)
    assert outcome is RecordOutcome.SPOOLED
    assert ledger.spool_depth() == 1
    assert await ledger.replay_spool() == 0
    assert ledger.spool_depth() == 0
    assert (await reports.usage_for_key("key-a", days=1))["requests"] == 1


async def test_redis_and_disk_both_failing_is_reported_not_raised(
    own_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    client = Redis.from_url(own_redis.url, socket_connect_timeout=1, socket_timeout=2)
    spool_dir = tmp_path / "spool"
    ledger = UsageLedger(client, spool=Spool(spool_dir), retention_days=30)
    try:
        own_redis.kill()
        shutil.rmtree(spool_dir)
        spool_dir.write_text("not a directory")  # the disk path is broken too
        assert await ledger.record(event("req-lost")) is RecordOutcome.LOST
    finally:
        await client.aclose()


async def test_settle_and_record_share_one_pipeline_with_the_real_limiter(
    ledger: UsageLedger, reports: UsageReports, redis_client: Redis
) -> None:
    from gateway.metering.limits import KeyLimits, Limiter

    limiter = Limiter(redis_client)
    limits = KeyLimits(rpm=100, tpm=100_000, budget_nanos=usd_to_nanos(10.0))
    reservation = await limiter.reserve(
        "key-a", limits, tokens=500, cost_nanos=usd_to_nanos(0.01), request_id="req-limited"
    )
    used = event("req-limited", prompt_tokens=100, completion_tokens=20, cost_nanos=123_456)
    pipe = redis_client.pipeline(transaction=False)
    limiter.add_settle(pipe, reservation, tokens=used.total_tokens, cost_nanos=used.cost_nanos)
    position = ledger.add_record(pipe, used)
    outcome, replies = await ledger.commit(pipe, used, position)
    assert outcome is RecordOutcome.RECORDED
    assert len(replies) == 5  # one settle, three index writes, one record: one round trip
    status = await limiter.status("key-a", limits)
    assert status["tokens"]["used"] == used.total_tokens  # the estimate of 500 was replaced
    assert status["budget"]["spent_nanos"] == used.cost_nanos == 123_456
    assert (await reports.usage_for_key("key-a", days=1))["total_cost_nanos"] == 123_456
