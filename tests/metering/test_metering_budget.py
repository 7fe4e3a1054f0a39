"""Budgets stop exactly at the limit, per UTC day, month or in total, in nano-dollars."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import redis.asyncio
from redis_helpers import ClientFactory

from gateway.errors import RateLimited
from gateway.metering.limits import AlreadyHeld, KeyLimits, Limiter, Reservation
from gateway.money import usd_to_nanos


@pytest.fixture
def client(clean_redis: str, make_client: ClientFactory) -> redis.asyncio.Redis:
    return make_client(clean_redis)


def _expected_window(period: str, at: float) -> str:
    moment = datetime.fromtimestamp(at, UTC)
    return {"day": moment.strftime("%Y-%m-%d"), "month": moment.strftime("%Y-%m")}.get(
        period, "total"
    )


@pytest.mark.parametrize("period", ["day", "month", "total"])
async def test_budget_stops_exactly_at_the_budget(
    period: str, client: redis.asyncio.Redis, clean_redis: str, make_client: ClientFactory
) -> None:
    replicas = [Limiter(client), Limiter(make_client(clean_redis))]
    limits = KeyLimits(budget_nanos=usd_to_nanos(0.3), budget_period=period)  # type: ignore[arg-type]
    # 0.1 + 0.1 + 0.1 is not <= 0.3 in floats; in nano-dollars it is
    held = [
        await replicas[i % 2].reserve(
            "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.1), request_id=f"r{i}"
        )
        for i in range(3)
    ]
    assert {h.budget_window for h in held} == {_expected_window(period, held[0].at)}
    with pytest.raises(RateLimited) as refused:
        await replicas[0].reserve(
            "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.000001), request_id="over"
        )
    error = refused.value
    assert (error.type, error.code, error.status) == ("insufficient_quota",) * 2 + (429,)
    assert "$0.3" in error.message
    # only in-flight holds are in the way: they settle soon, so the wait is short
    assert error.headers["retry-after"] == "1"
    assert "x-should-retry" not in error.headers
    for h in held:
        await replicas[1].settle(h, tokens=0, cost_nanos=usd_to_nanos(0.1))
    with pytest.raises(RateLimited) as spent:
        await replicas[0].reserve("k", limits, tokens=0, cost_nanos=0, request_id="free")
    assert spent.value.headers["x-should-retry"] == "false"
    if period != "total":
        assert int(spent.value.headers["retry-after"]) > 1  # until the window rolls over
    status = await replicas[0].status("k", limits)
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.3)
    assert status["budget"]["remaining_nanos"] == 0


async def test_concurrent_budget_reserves_are_exact(
    client: redis.asyncio.Redis, clean_redis: str, make_client: ClientFactory
) -> None:
    replicas = [
        Limiter(client),
        Limiter(make_client(clean_redis)),
        Limiter(make_client(clean_redis)),
    ]
    limits = KeyLimits(budget_nanos=usd_to_nanos(1.0), budget_period="month")

    async def attempt(i: int) -> Reservation | RateLimited:
        try:
            return await replicas[i % 3].reserve(
                "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.05), request_id=f"r{i}"
            )
        except RateLimited as refusal:
            return refusal

    outcomes = await asyncio.gather(*(attempt(i) for i in range(60)))
    assert sum(isinstance(o, Reservation) for o in outcomes) == 20
    assert {o.code for o in outcomes if isinstance(o, RateLimited)} == {"insufficient_quota"}


async def test_a_new_window_starts_from_zero(client: redis.asyncio.Redis) -> None:
    limiter = Limiter(client)
    limits = KeyLimits(budget_nanos=usd_to_nanos(1.0), budget_period="day")
    day_key = limiter.keys("k")[4]
    # yesterday's counter, fully spent
    await client.hset(day_key, mapping={"window": "2000-01-01", "spent": 1_000_000, "reserved": 0})
    held = await limiter.reserve(
        "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.9), request_id="r1"
    )
    assert held.budget_window == _expected_window("day", held.at)
    assert await client.hget(day_key, "spent") == b"0"
    ttl_ms = await client.pttl(day_key)
    assert 86_400_000 < ttl_ms <= 2 * 86_400_000  # rest of today plus a day for late settles


async def test_periods_are_counted_separately_and_total_never_expires(
    client: redis.asyncio.Redis,
) -> None:
    limiter = Limiter(client)
    total = KeyLimits(budget_nanos=usd_to_nanos(1.0), budget_period="total")
    held = await limiter.reserve(
        "k", total, tokens=0, cost_nanos=usd_to_nanos(1.0), request_id="r1"
    )
    await limiter.settle(held, tokens=0, cost_nanos=usd_to_nanos(1.0))
    assert await client.pttl(limiter.keys("k")[6]) == -1
    # switching the key to a monthly budget does not inherit (or erase) the lifetime spend
    monthly = KeyLimits(budget_nanos=usd_to_nanos(1.0), budget_period="month")
    await limiter.reserve("k", monthly, tokens=0, cost_nanos=usd_to_nanos(0.5), request_id="r2")
    assert (await limiter.status("k", total))["budget"]["spent_nanos"] == usd_to_nanos(1.0)


async def test_a_budget_hold_holds_money_for_hours_and_counts_no_rate(
    client: redis.asyncio.Redis,
) -> None:
    """A provider's batch line (docs/batches.md): its worst case is held against the budget
    alone, past the limiter's lease; its settle charges the money, never a request or tokens;
    a release gives the hold back without refunding a request it never took."""
    limiter = Limiter(client, lease_s=1.0)
    limits = KeyLimits(rpm=1, tpm=10, budget_nanos=usd_to_nanos(1.0), max_parallel=1)
    day_ms = 24 * 3600 * 1000
    held = [
        await limiter.reserve(
            "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.4), request_id=f"h{i}", hold_ms=day_ms
        )
        for i in range(2)
    ]  # neither the RPM of 1 nor max_parallel 1 is in the way: no request is counted
    with pytest.raises(AlreadyHeld):
        await limiter.reserve("k", limits, tokens=0, cost_nanos=1, request_id="h0", hold_ms=day_ms)
    with pytest.raises(RateLimited) as over:  # the budget is: 0.8 of 1.0 held
        await limiter.reserve(
            "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.3), request_id="h2", hold_ms=day_ms
        )
    assert over.value.code == "insufficient_quota"
    await asyncio.sleep(1.1)  # past the limiter's lease: an interactive reserve reclaims lapsed
    interactive = await limiter.reserve(
        "k", limits, tokens=5, cost_nanos=usd_to_nanos(0.1), request_id="i1"
    )
    status = await limiter.status("k", limits)
    assert status["requests"]["used"] == 1 and status["tokens"]["used"] == 5
    assert status["budget"]["reserved_nanos"] == usd_to_nanos(0.9)  # the holds outlived it
    assert await limiter.settle(held[0], tokens=900, cost_nanos=usd_to_nanos(0.25))
    assert await limiter.release(held[1])
    await limiter.release(interactive)
    status = await limiter.status("k", limits)
    assert status["requests"]["used"] == 0 and status["tokens"]["used"] == 0
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.25)
    assert status["budget"]["reserved_nanos"] == 0
