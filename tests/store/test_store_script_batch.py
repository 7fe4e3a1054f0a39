"""ScriptBatch: EVALSHA in one round trip, NOSCRIPT answered by loading and resending only the
commands that did not run, so each settle and record takes effect exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis.exceptions
from redis_helpers import ClientFactory

from gateway.metering.ledger import RECORD_LUA, UsageEvent, UsageLedger
from gateway.metering.limits import KeyLimits, Limiter
from gateway.metering.spool import Spool
from gateway.money import usd_to_nanos
from gateway.store.scripts import ScriptBatch

LIMITS = KeyLimits(rpm=100, tpm=10_000, budget_nanos=usd_to_nanos(5.0), budget_period="day")


def _event(request_id: str, completion: int) -> UsageEvent:
    return UsageEvent(
        time=time.time(),
        request_id=request_id,
        key_id="batch-key",
        model="m",
        provider="p",
        prompt_tokens=10,
        completion_tokens=completion,
        cost_nanos=usd_to_nanos(0.01),
    )


async def test_a_half_flushed_cache_runs_each_script_exactly_once(
    clean_redis: str, make_client: ClientFactory, tmp_path: Path
) -> None:
    client = make_client(clean_redis)
    limiter = Limiter(client)
    ledger = UsageLedger(client, spool=Spool(tmp_path / "spool"), retention_days=30)
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
        record = ledger.queue_record(batch, _event(reservation.request_id, index))
        positions.append((settle, record))
    replies = await batch.execute(client)
    assert [(replies[s], replies[r]) for s, r in positions] == [([1], 1)] * 3  # settled, no alert
    assert await client.script_exists(RECORD_LUA.sha) == [True]

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
        ledger.queue_record(again, _event(reservation.request_id, 99))
    replies = await again.execute(client)
    assert [replies[s] for s, _ in positions] == [[0], [0], [0]]
    assert [replies[r] for _, r in positions] == [0, 0, 0]
    assert (await limiter.status("batch-key", LIMITS))["tokens"]["used"] == 33
    assert await client.xlen("sy:{key:batch-key}:usage:events") == 3


async def test_an_error_other_than_noscript_raises_after_the_rest_ran(
    clean_redis: str, make_client: ClientFactory, tmp_path: Path
) -> None:
    client = make_client(clean_redis)
    ledger = UsageLedger(client, spool=Spool(tmp_path / "spool"), retention_days=30)
    await client.hset("not-a-counter", "x", 1)
    await client.script_flush()
    batch = ScriptBatch()
    batch.command("INCRBY", "not-a-counter", 1)  # WRONGTYPE
    ledger.queue_record(batch, _event("r-neighbour", 1))
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await batch.execute(client)
    # The record still ran (after its NOSCRIPT retry): a replay would find its marker.
    assert await client.xlen("sy:{key:batch-key}:usage:events") == 1
    assert await ledger.record(_event("r-neighbour", 1)) == "duplicate"


async def test_an_empty_batch_sends_nothing(clean_redis: str, make_client: ClientFactory) -> None:
    assert await ScriptBatch().execute(make_client(clean_redis)) == []
