"""Team limits in the limiter: shared by the team's keys, checked in the same atomic step as
each key's own, budgets per period exact, and in-flight caps whose leases lapse when nobody
renews them. Several independent Redis clients play the replicas."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio
from redis_helpers import ClientFactory

from gateway.access.teams import TeamStore, team_home
from gateway.errors import RateLimited
from gateway.metering.limits import KeyLimits, Limiter, Reservation
from gateway.money import usd_to_nanos

HOME = team_home("search")
NO_LIMITS = KeyLimits()


@pytest.fixture
def client(clean_redis: str, make_client: ClientFactory) -> redis.asyncio.Redis:
    return make_client(clean_redis)


async def _attempt(
    limiter: Limiter, key_id: str, limits: KeyLimits, request_id: str, **take: int
) -> Reservation | RateLimited:
    try:
        return await limiter.reserve(
            key_id,
            limits,
            tokens=take.get("tokens", 0),
            cost_nanos=take.get("cost", 0),
            request_id=request_id,
            home=HOME,
        )
    except RateLimited as refusal:
        return refusal


async def test_a_team_rpm_is_shared_exactly_by_its_keys(
    client: redis.asyncio.Redis, clean_redis: str, make_client: ClientFactory
) -> None:
    await TeamStore(client).create("search", {"rpm": 100})
    replicas = [Limiter(make_client(clean_redis)) for _ in range(3)]
    outcomes = await asyncio.gather(
        *(_attempt(replicas[i % 3], f"key{i % 2}", NO_LIMITS, f"r{i}") for i in range(300))
    )
    granted = [o for o in outcomes if isinstance(o, Reservation)]
    refused = [o for o in outcomes if isinstance(o, RateLimited)]
    assert len(granted) == 100 and len(refused) == 200
    # How the 100 split between the keys depends on which replica's batch reached Redis
    # first; what is fixed is that every refusal was the team's.
    assert all("of team 'search'" in r.message for r in refused)
    assert {r.headers["x-ratelimit-limit-requests"] for r in refused} == {"100"}
    # A key of the team that has taken nothing finds the team's window already full.
    late = await _attempt(replicas[0], "key2", NO_LIMITS, "late")
    assert isinstance(late, RateLimited) and "of team 'search'" in late.message
    status = await replicas[0].team_status(
        "search", rpm=100, tpm=None, budgets_nanos={}, max_parallel=None
    )
    assert (status["requests"]["used"], status["requests"]["remaining"]) == (100, 0)


async def test_key_and_team_are_checked_together_and_a_refusal_takes_nothing(
    client: redis.asyncio.Redis,
) -> None:
    await TeamStore(client).create("search", {"tpm": 1000})
    limiter = Limiter(client)
    tight = KeyLimits(rpm=2)
    for i in range(2):
        assert isinstance(await _attempt(limiter, "k", tight, f"a{i}", tokens=100), Reservation)
    refused = await _attempt(limiter, "k", tight, "a2", tokens=100)
    assert isinstance(refused, RateLimited) and "of team" not in refused.message  # the key's
    # The headers show whichever window has the least room left: the key's requests, the
    # team's tokens.
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "800"
    team = await limiter.team_status(
        "search", rpm=None, tpm=1000, budgets_nanos={}, max_parallel=None
    )
    assert team["tokens"]["used"] == 200 and team["requests"]["used"] == 2  # nothing taken
    too_big = await _attempt(limiter, "other", NO_LIMITS, "b", tokens=801)
    assert isinstance(too_big, RateLimited) and "of team 'search'" in too_big.message
    mine = await limiter.status("other", NO_LIMITS, home=HOME)
    assert mine["requests"]["used"] == 0  # the key's own window did not take it either


async def test_team_budgets_per_period_stop_exactly_and_settle_to_spend(
    client: redis.asyncio.Redis, clean_redis: str, make_client: ClientFactory
) -> None:
    budgets = {"day": usd_to_nanos(0.7), "week": usd_to_nanos(5), "month": usd_to_nanos(0.5)}
    await TeamStore(client).create("search", {"budgets_nanos": budgets})
    replicas = [Limiter(make_client(clean_redis)) for _ in range(3)]
    cost = usd_to_nanos(0.1)
    outcomes = await asyncio.gather(
        *(
            _attempt(replicas[i % 3], f"key{i % 2}", NO_LIMITS, f"r{i}", cost=cost)
            for i in range(40)
        )
    )
    granted = [o for o in outcomes if isinstance(o, Reservation)]
    refused = [o for o in outcomes if isinstance(o, RateLimited)]
    assert len(granted) == 5  # the month's $0.50 is the tightest: 0.1 x 5 exactly
    assert {(r.type, r.code) for r in refused} == {("insufficient_quota", "insufficient_quota")}
    assert "this key's team 'search' may spend $0.5 per month" in refused[0].message
    for held in granted:
        assert await replicas[1].settle(held, tokens=0, cost_nanos=usd_to_nanos(0.07))
    status = await replicas[0].team_status(
        "search", rpm=None, tpm=None, budgets_nanos=budgets, max_parallel=None
    )
    for period in budgets:
        assert status["budgets"][period]["spent_nanos"] == 5 * usd_to_nanos(0.07)
        assert status["budgets"][period]["reserved_nanos"] == 0
    # $0.35 spent of the month's $0.50: two more requests of $0.07 fit, a third does not.
    fits = [
        await _attempt(replicas[2], "key0", NO_LIMITS, f"s{i}", cost=usd_to_nanos(0.07))
        for i in range(3)
    ]
    assert [isinstance(f, Reservation) for f in fits] == [True, True, False]


async def test_in_flight_caps_hold_while_renewed_and_lapse_when_the_holder_dies(
    client: redis.asyncio.Redis, clean_redis: str, make_client: ClientFactory
) -> None:
    await TeamStore(client).create("search", {"max_parallel_requests": 3})
    alive = Limiter(client, in_flight_lease_s=0.6)
    dying = Limiter(make_client(clean_redis), in_flight_lease_s=0.6)
    capped = KeyLimits(max_parallel=1)
    assert isinstance(await _attempt(alive, "k1", capped, "a1"), Reservation)
    second = await _attempt(alive, "k1", capped, "a2")
    assert isinstance(second, RateLimited) and second.code == "too_many_parallel_requests"
    assert "max_parallel_requests" in second.message and "of team" not in second.message
    for i in range(2):
        assert isinstance(await _attempt(dying, f"k{i + 2}", NO_LIMITS, f"d{i}"), Reservation)
    full = await _attempt(alive, "k5", NO_LIMITS, "a3")
    assert isinstance(full, RateLimited) and "of team 'search'" in full.message
    # One replica keeps renewing its request; the other "dies" (never renews).
    for _ in range(4):
        await asyncio.sleep(0.25)
        assert await alive.renew_in_flight() == 2  # key scope and team scope of a1
    assert alive.flying == 1
    still = await _attempt(alive, "k1", capped, "a4")
    assert isinstance(still, RateLimited)  # a1 is still running: its lease held
    freed = await _attempt(alive, "k5", NO_LIMITS, "a5")
    assert isinstance(freed, Reservation)  # the dead replica's two leases lapsed
    status = await alive.team_status("search", rpm=None, tpm=None, budgets_nanos={}, max_parallel=3)
    assert status["parallel"] == {"limit": 3, "in_flight": 2}
    await alive.release(freed)
    assert alive.flying == 1  # a released request is renewed no more


async def test_a_week_budget_for_a_key(client: redis.asyncio.Redis) -> None:
    limiter = Limiter(client)
    limits = KeyLimits(budget_nanos=usd_to_nanos(0.2), budget_period="week")
    held = await limiter.reserve(
        "k", limits, tokens=0, cost_nanos=usd_to_nanos(0.2), request_id="w1"
    )
    assert held.budget_window is not None and "-W" in held.budget_window
    with pytest.raises(RateLimited) as over:
        await limiter.reserve("k", limits, tokens=0, cost_nanos=1, request_id="w2")
    assert "per week" in over.value.message
    assert 0 < int(over.value.headers["retry-after"]) <= 7 * 86400 or (
        over.value.headers["retry-after"] == "1"
    )
