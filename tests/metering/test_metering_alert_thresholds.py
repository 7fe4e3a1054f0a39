"""Alert thresholds in the settle script: crossed exactly at ceil(budget x percent / 100), by
exactly one settle, concurrent settles included; a soft budget is charged but never refuses."""

from __future__ import annotations

import asyncio

import pytest
from redis_helpers import ClientFactory

from gateway.errors import RateLimited
from gateway.metering.limits import KeyLimits, Limiter, settle_crossings
from gateway.store.direct import DirectRedis
from gateway.store.scripts import ScriptBatch

BUDGET = 1_000_000_007  # nano-dollars: 50 % is 500,000,003.5, so the threshold is ...004


@pytest.fixture
def limiter(clean_redis: str, make_client: ClientFactory) -> Limiter:
    return Limiter(make_client(clean_redis))


async def _spend(limiter: Limiter, limits: KeyLimits, rid: str, nanos: int) -> list:
    held = await limiter.reserve("k", limits, tokens=1, cost_nanos=0, request_id=rid)
    batch = ScriptBatch()
    at = limiter.queue_settle(batch, held, tokens=1, cost_nanos=nanos)
    replies = await batch.execute(DirectRedis(limiter._redis))
    return settle_crossings(held, replies[at])


async def test_a_threshold_is_crossed_at_its_exact_nano_dollar(limiter: Limiter) -> None:
    limits = KeyLimits(budget_nanos=BUDGET, budget_period="day", alert_thresholds=(50, 100))
    assert await _spend(limiter, limits, "r1", 500_000_003) == []
    [half] = await _spend(limiter, limits, "r2", 1)
    assert (half.scope, half.scope_id, half.threshold) == ("key", "k", 50)
    assert (half.spent_nanos, half.budget_nanos, half.period) == (500_000_004, BUDGET, "day")
    assert await _spend(limiter, limits, "r3", BUDGET - 500_000_004 - 1) == []
    [full] = await _spend(limiter, limits, "r4", 5)  # past 100 % in one step: one alert
    assert full.threshold == 100 and full.spent_nanos == BUDGET + 4


async def test_concurrent_settles_cross_each_threshold_once(limiter: Limiter) -> None:
    limits = KeyLimits(budget_nanos=100, budget_period="total", alert_thresholds=(10, 50, 90))
    found = await asyncio.gather(*(_spend(limiter, limits, f"r{i}", 7) for i in range(20)))
    assert sorted(c.threshold for crossings in found for c in crossings) == [10, 50, 90]


async def test_a_soft_budget_is_charged_but_never_refuses(limiter: Limiter) -> None:
    soft = KeyLimits(budget_nanos=100, budget_period="total", budget_soft=True)
    for i in range(3):
        await _spend(limiter, soft, f"s{i}", 60)
    status = await limiter.status("k", soft)
    assert status["budget"]["spent_nanos"] == 180
    hard = KeyLimits(budget_nanos=100, budget_period="total")
    with pytest.raises(RateLimited):
        await limiter.reserve("k", hard, tokens=1, cost_nanos=1, request_id="h1")
