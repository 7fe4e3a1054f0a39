"""Reserves of one key started in the same event-loop turn go to Redis in one script call, and
the settles of one key in a settle batch in one call: the verdicts, headers, refunds and alert
crossings are those of one call per request, in order."""

from __future__ import annotations

import asyncio

import pytest
from redis_helpers import ClientFactory

from gateway.errors import RateLimited
from gateway.metering.limits import KeyLimits, Limiter, Reservation, settles_crossings
from gateway.store.direct import DirectRedis
from gateway.store.scripts import ScriptBatch


@pytest.fixture
def limiter(clean_redis: str, make_client: ClientFactory) -> Limiter:
    return Limiter(make_client(clean_redis))


async def _evalsha_calls(limiter: Limiter) -> int:
    stats = await limiter._redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def _attempt(limiter: Limiter, limits: KeyLimits, rid: str, tokens: int):
    try:
        return await limiter.reserve("k", limits, tokens=tokens, cost_nanos=0, request_id=rid)
    except (RateLimited, ValueError) as refused:
        return refused


async def test_one_turns_reserves_are_one_call_with_sequential_verdicts(
    limiter: Limiter,
) -> None:
    limits = KeyLimits(rpm=5, tpm=100)
    before = await _evalsha_calls(limiter)
    # 50 tokens do not fit after 60; "a" is asked twice; the 5th request fits rpm 5 exactly
    asks = [("a", 30), ("b", 30), ("c", 50), ("d", 30), ("a", 1), ("e", 10), ("f", 0)]
    outcomes = await asyncio.gather(*(_attempt(limiter, limits, r, t) for r, t in asks))
    assert await _evalsha_calls(limiter) - before == 1
    assert [type(o).__name__ for o in outcomes] == [
        "Reservation",
        "Reservation",
        "RateLimited",
        "Reservation",
        "AlreadyHeld",  # a ValueError: the request id holds one already
        "Reservation",
        "Reservation",
    ]
    granted = [o for o in outcomes if isinstance(o, Reservation)]
    remaining = [
        (g.headers["x-ratelimit-remaining-requests"], g.headers["x-ratelimit-remaining-tokens"])
        for g in granted
    ]
    assert remaining == [("4", "70"), ("3", "40"), ("2", "10"), ("1", "0"), ("0", "0")]
    assert "tokens per minute" in str(outcomes[2])
    status = await limiter.status("k", limits)
    assert status["tokens"]["used"] == 100
    assert status["requests"]["used"] == len(granted)
    assert status["in_flight"] == len(granted)


async def test_the_same_requests_one_by_one_get_the_same_verdicts(
    clean_redis: str, make_client: ClientFactory
) -> None:
    limits = KeyLimits(rpm=4, tpm=100)
    asks = [("a", 30), ("b", 30), ("c", 50), ("d", 30), ("a", 1), ("e", 10), ("f", 0)]
    together = Limiter(make_client(clean_redis))
    batched = await asyncio.gather(*(_attempt(together, limits, r, t) for r, t in asks))
    await make_client(clean_redis).flushall()
    alone = Limiter(make_client(clean_redis))
    sequential = [await _attempt(alone, limits, r, t) for r, t in asks]

    def verdict(outcome: object) -> tuple[str, str]:
        if isinstance(outcome, Reservation):
            return "ok", outcome.headers["x-ratelimit-remaining-tokens"]
        return type(outcome).__name__, str(outcome).split(".")[0]

    assert [verdict(o) for o in batched] == [verdict(o) for o in sequential]


async def test_a_reserve_cancelled_while_gathering_leaves_the_others_served(
    limiter: Limiter,
) -> None:
    limits = KeyLimits(rpm=10)
    first = asyncio.ensure_future(
        limiter.reserve("k", limits, tokens=1, cost_nanos=0, request_id="gone")
    )
    await asyncio.sleep(0)  # it gathers
    others = [
        asyncio.ensure_future(
            limiter.reserve("k", limits, tokens=1, cost_nanos=0, request_id=f"r{i}")
        )
        for i in range(3)
    ]
    await asyncio.sleep(0)  # they join it
    first.cancel()
    served = await asyncio.gather(*others)
    assert [r.request_id for r in served] == ["r0", "r1", "r2"]
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (await limiter.status("k", limits))["requests"]["used"] == 3


async def test_one_keys_settles_in_one_call_apply_once_each_in_order(limiter: Limiter) -> None:
    limits = KeyLimits(
        tpm=1000, budget_nanos=100, budget_period="total", alert_thresholds=(10, 50, 90)
    )
    held = [
        await limiter.reserve("k", limits, tokens=50, cost_nanos=10, request_id=f"r{i}")
        for i in range(6)
    ]
    batch = ScriptBatch()
    # r2 twice in one call, and what each used: 7 nano-dollars, tokens 20 (30 back to each)
    settles = [(h, 20, 7) for h in held] + [(held[2], 20, 7)]
    runs = limiter.queue_settles(batch, settles)
    assert len(runs) == 1
    before = await _evalsha_calls(limiter)
    replies = await batch.execute(DirectRedis(limiter._redis))
    assert await _evalsha_calls(limiter) - before == 1
    position, reservations = runs[0]
    assert replies[position][:7] == [1, 1, 1, 1, 1, 1, 0]
    crossings = settles_crossings(reservations, replies[position])
    # spend 7, 14, 21, ...: 10 % (10) crossed by the 2nd settle, 50 % by the 8th... only 6 ran
    assert [(c.threshold, c.spent_nanos) for c in crossings] == [(10, 14)]
    status = await limiter.status("k", limits)
    assert status["budget"]["spent_nanos"] == 42
    assert status["budget"]["reserved_nanos"] == 0
    assert status["tokens"]["used"] == 6 * 20
    assert status["in_flight"] == 0
