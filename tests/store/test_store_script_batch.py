"""ScriptBatch: EVALSHA in one round trip, NOSCRIPT answered by loading and resending only the
commands that did not run, so each settle takes effect exactly once; the usage records (plain
XADDs beside them) reach the store once each."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis.exceptions
from redis.asyncio import Redis
from redis_helpers import ClientFactory

from gateway.ledger import EventQuery, UsageEvent, UsageStore
from gateway.metering.buffer import UsageBuffer
from gateway.metering.exporter import UsageExporter
from gateway.metering.limits import KeyLimits, Limiter
from gateway.metering.recorder import UsageRecorder
from gateway.metering.spool import Spool
from gateway.money import usd_to_nanos
from gateway.store.scripts import ScriptBatch

LIMITS = KeyLimits(rpm=100, tpm=10_000, budget_nanos=usd_to_nanos(5.0), budget_period="day")


def _event(request_id: str, completion: int) -> UsageEvent:
    return UsageEvent(
        event_id=request_id,
        time_ms=int(time.time() * 1000),
        key_id="batch-key",
        model="m",
        provider="p",
        prompt_tokens=10,
        completion_tokens=completion,
        cost_nanos=usd_to_nanos(0.01),
    )


@pytest.fixture
def client(clean_redis: str, make_client: ClientFactory) -> Redis:
    """A replica's client of the emptied session Redis (here, not the folder's cluster client)."""
    return make_client(clean_redis)


@pytest.fixture
def recorder(client: Redis, usage_store: UsageStore, tmp_path: Path) -> UsageRecorder:
    """A recorder recording through ``client`` (the root conftest's has a client of its own)."""
    buffer = UsageBuffer(client)
    buffer.bind(usage_store.store_id)
    return UsageRecorder(buffer, spool=Spool(tmp_path / "spool"))


async def _stored(exporter: UsageExporter, recorder: UsageRecorder, store: UsageStore) -> dict:
    """Export what the recorder buffered; the store's events by id."""
    moving = UsageExporter(
        recorder.buffer, store, exporter.settings, exporter.metrics, exporter.log
    )  # on the test's own client
    await moving.drain()
    page = await store.list_events(EventQuery(limit=1000))
    return {stored.event_id: stored for stored in page.events}


async def test_a_half_flushed_cache_runs_each_script_exactly_once(
    client: Redis, recorder: UsageRecorder, usage_store: UsageStore, exporter: UsageExporter
) -> None:
    limiter = Limiter(client)
    held = [
        await limiter.reserve(
            "batch-key", LIMITS, tokens=100, cost_nanos=usd_to_nanos(0.5), request_id=f"r{i}"
        )
        for i in range(3)
    ]
    await client.script_flush()
    await client.script_load(limiter._settle_lua.source)  # settles run at once, records miss
    batch = ScriptBatch()
    positions = []
    for index, reservation in enumerate(held):
        settle = limiter.queue_settle(
            batch, reservation, tokens=10 + index, cost_nanos=usd_to_nanos(0.01)
        )
        record = recorder.queue_record(batch, _event(reservation.request_id, index))
        positions.append((settle, record))
    replies = await batch.execute(client)
    assert [replies[s] for s, _ in positions] == [[1], [1], [1]]  # settled, no alert
    assert all(b"-" in replies[r] for _, r in positions)  # buffer entry ids
    assert await client.script_exists(limiter._settle_lua.sha) == [True]

    status = await limiter.status("batch-key", LIMITS)
    assert status["tokens"]["used"] == 10 + 11 + 12
    assert status["budget"]["reserved_nanos"] == 0
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.03)
    assert status["in_flight"] == 0

    # The same batch again, after another flush: both kinds are no-ops now.
    await client.script_flush()
    again = ScriptBatch()
    for reservation in held:
        limiter.queue_settle(again, reservation, tokens=99, cost_nanos=usd_to_nanos(1.0))
        recorder.queue_record(again, _event(reservation.request_id, 99))
    replies = await again.execute(client)
    assert [replies[s] for s, _ in positions] == [[0], [0], [0]]
    assert (await limiter.status("batch-key", LIMITS))["tokens"]["used"] == 33
    # The records went to the buffer twice; the store keeps each request's first copy.
    assert (await recorder.buffer.stats()).backlog == 6
    stored = await _stored(exporter, recorder, usage_store)
    assert {i: stored[r.request_id].completion_tokens for i, r in enumerate(held)} == {
        0: 0,
        1: 1,
        2: 2,
    }


async def test_an_error_other_than_noscript_raises_after_the_rest_ran(
    client: Redis, recorder: UsageRecorder, usage_store: UsageStore, exporter: UsageExporter
) -> None:
    await client.hset("not-a-counter", "x", 1)
    await client.script_flush()
    batch = ScriptBatch()
    batch.command("INCRBY", "not-a-counter", 1)  # WRONGTYPE
    recorder.queue_record(batch, _event("r-neighbour", 1))
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await batch.execute(client)
    # The record still ran: the settle batch spools it all the same, and its replay is stored
    # once with the first copy.
    assert (await recorder.buffer.stats()).backlog == 1
    await recorder.spool_events([_event("r-neighbour", 1)])
    assert await recorder.replay_spool() == 1
    assert list(await _stored(exporter, recorder, usage_store)) == ["r-neighbour"]


async def test_an_empty_batch_sends_nothing(client: Redis) -> None:
    assert await ScriptBatch().execute(client) == []
