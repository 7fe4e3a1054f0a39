"""Settle refunds and over-charges, release gives everything back, both exactly once."""

from __future__ import annotations

import asyncio

import pytest
from redis_helpers import ClientFactory

from gateway.errors import RateLimited
from gateway.metering.limits import KeyLimits, Limiter
from gateway.money import usd_to_nanos


@pytest.fixture
def limiter(clean_redis: str, make_client: ClientFactory) -> Limiter:
    return Limiter(make_client(clean_redis))


async def test_settle_refunds_unused_tokens_and_budget(limiter: Limiter) -> None:
    limits = KeyLimits(tpm=100, budget_nanos=usd_to_nanos(1.0))
    held = await limiter.reserve(
        "k", limits, tokens=60, cost_nanos=usd_to_nanos(0.6), request_id="r1"
    )
    with pytest.raises(RateLimited):
        await limiter.reserve("k", limits, tokens=60, cost_nanos=usd_to_nanos(0.1), request_id="r2")
    assert await limiter.settle(held, tokens=20, cost_nanos=usd_to_nanos(0.15)) is True
    status = await limiter.status("k", limits)
    assert status["tokens"]["used"] == 20
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.15)
    assert status["budget"]["reserved_nanos"] == 0
    assert status["in_flight"] == 0
    # the refund makes room: 20 + 80 fits exactly
    again = await limiter.reserve(
        "k", limits, tokens=80, cost_nanos=usd_to_nanos(0.85), request_id="r3"
    )
    assert again.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_settle_charges_tokens_and_cost_beyond_the_estimate(limiter: Limiter) -> None:
    limits = KeyLimits(tpm=100, budget_nanos=usd_to_nanos(1.0))
    held = await limiter.reserve(
        "k", limits, tokens=10, cost_nanos=usd_to_nanos(0.1), request_id="r1"
    )
    await limiter.settle(held, tokens=95, cost_nanos=usd_to_nanos(0.97))
    status = await limiter.status("k", limits)
    assert status["tokens"]["used"] == 95
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.97)
    with pytest.raises(RateLimited, match="tokens per minute"):
        await limiter.reserve(
            "k", limits, tokens=10, cost_nanos=usd_to_nanos(0.01), request_id="r2"
        )


async def test_settle_is_idempotent(limiter: Limiter) -> None:
    limits = KeyLimits(tpm=100, budget_nanos=usd_to_nanos(1.0))
    held = await limiter.reserve(
        "k", limits, tokens=50, cost_nanos=usd_to_nanos(0.5), request_id="r1"
    )
    assert await limiter.settle(held, tokens=30, cost_nanos=usd_to_nanos(0.3)) is True
    assert await limiter.settle(held, tokens=30, cost_nanos=usd_to_nanos(0.3)) is False
    assert await limiter.release(held) is False
    status = await limiter.status("k", limits)
    assert status["tokens"]["used"] == 30
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.3)


async def test_release_refunds_request_tokens_and_budget(limiter: Limiter) -> None:
    limits = KeyLimits(rpm=1, tpm=100, budget_nanos=usd_to_nanos(0.5), budget_period="day")
    held = await limiter.reserve(
        "k", limits, tokens=100, cost_nanos=usd_to_nanos(0.5), request_id="r1"
    )
    with pytest.raises(RateLimited):
        await limiter.reserve("k", limits, tokens=1, cost_nanos=0, request_id="r2")
    assert await limiter.release(held) is True
    status = await limiter.status("k", limits)
    assert (status["requests"]["used"], status["tokens"]["used"]) == (0, 0)
    assert status["budget"]["reserved_nanos"] == status["budget"]["spent_nanos"] == 0
    await limiter.reserve("k", limits, tokens=100, cost_nanos=usd_to_nanos(0.5), request_id="r3")


async def test_add_settle_shares_the_callers_pipeline(
    limiter: Limiter, clean_redis: str, make_client: ClientFactory
) -> None:
    limits = KeyLimits(tpm=100, budget_nanos=usd_to_nanos(1.0))
    held = await limiter.reserve(
        "k", limits, tokens=40, cost_nanos=usd_to_nanos(0.4), request_id="r1"
    )
    client = make_client(clean_redis)
    async with client.pipeline(transaction=True) as pipe:
        limiter.add_settle(pipe, held, tokens=25, cost_nanos=usd_to_nanos(0.123456))
        pipe.incr("usage-record-stand-in")
        settled, recorded = await pipe.execute()
    assert (settled, recorded) == ([1], 1)  # applied, no alert threshold crossed
    status = await limiter.status("k", limits)
    assert status["tokens"]["used"] == 25
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.123456)


async def test_lapsed_lease_returns_the_budget_hold_and_a_late_settle_still_charges(
    clean_redis: str, make_client: ClientFactory
) -> None:
    limiter = Limiter(make_client(clean_redis), lease_s=0.2)
    limits = KeyLimits(budget_nanos=usd_to_nanos(1.0), budget_period="total")
    stuck = await limiter.reserve(
        "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.6), request_id="dead-replica"
    )
    with pytest.raises(RateLimited):
        await limiter.reserve("k", limits, tokens=0, cost_nanos=usd_to_nanos(0.6), request_id="r1")
    await asyncio.sleep(0.3)
    fresh = await limiter.reserve(
        "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.6), request_id="r2"
    )
    assert await limiter.settle(stuck, tokens=0, cost_nanos=usd_to_nanos(0.25)) is True
    assert await limiter.settle(fresh, tokens=0, cost_nanos=usd_to_nanos(0.5)) is True
    status = await limiter.status("k", limits)
    assert status["budget"]["spent_nanos"] == usd_to_nanos(0.75)
    assert status["budget"]["reserved_nanos"] == 0
    assert await limiter.settle(stuck, tokens=0, cost_nanos=usd_to_nanos(0.25)) is False


async def test_bad_input_is_refused_clearly(
    limiter: Limiter, clean_redis: str, make_client: ClientFactory
) -> None:
    with pytest.raises(ValueError, match="rpm"):
        KeyLimits(rpm=-1)
    with pytest.raises(ValueError, match="budget_period"):
        KeyLimits(budget_nanos=usd_to_nanos(1), budget_period="fortnight")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget_nanos"):
        KeyLimits(budget_nanos=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget_nanos"):
        KeyLimits(budget_nanos=2**53)
    with pytest.raises(ValueError, match="finite"):
        usd_to_nanos(float("nan"))
    limits = KeyLimits(rpm=10)
    with pytest.raises(ValueError, match="tokens"):
        await limiter.reserve("k", limits, tokens=-1, cost_nanos=0, request_id="r1")
    with pytest.raises(ValueError, match="cost_nanos"):
        await limiter.reserve("k", limits, tokens=1, cost_nanos=-1, request_id="r1")
    with pytest.raises(ValueError, match="cost_nanos"):
        await limiter.reserve("k", limits, tokens=1, cost_nanos=0.5, request_id="r1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key_id"):
        await limiter.reserve("", limits, tokens=1, cost_nanos=0, request_id="r1")
    held = await limiter.reserve("k", limits, tokens=1, cost_nanos=0, request_id="r1")
    with pytest.raises(ValueError, match="already holds"):
        await limiter.reserve("k", limits, tokens=1, cost_nanos=0, request_id="r1")
    with pytest.raises(ValueError, match="tokens"):
        await limiter.settle(held, tokens=-5, cost_nanos=0)
    # nothing was taken by the refused calls
    assert (await limiter.status("k", limits))["requests"]["used"] == 1
    with pytest.raises(ValueError, match="divisible"):
        Limiter(make_client(clean_redis), window_s=1.0, buckets=7)
