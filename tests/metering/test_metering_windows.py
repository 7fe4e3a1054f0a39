"""The Lua budget-window arithmetic agrees with Python's calendar at awkward dates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis_helpers import ClientFactory

from gateway.metering.limits import KeyLimits, Limiter, script_source
from gateway.money import usd_to_nanos

_PROBE = "local w, e = budget_window(ARGV[1], tonumber(ARGV[2])) return {w, e}"

_MOMENTS = [
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2000, 2, 29, 23, 59, 59, 999000, tzinfo=UTC),
    datetime(2023, 12, 31, 23, 59, 59, tzinfo=UTC),
    datetime(2024, 1, 1, tzinfo=UTC),
    datetime(2024, 2, 29, 12, tzinfo=UTC),
    datetime(2025, 2, 28, 23, 59, 59, tzinfo=UTC),
    datetime(2100, 3, 1, tzinfo=UTC),
    # ISO weeks whose year is not the calendar year, and a 53-week year
    datetime(2020, 12, 31, 23, 59, tzinfo=UTC),
    datetime(2021, 1, 3, 12, tzinfo=UTC),
    datetime(2024, 12, 30, tzinfo=UTC),
    datetime(2026, 6, 7, 23, 59, 59, tzinfo=UTC),
]


def _month_end(moment: datetime) -> datetime:
    first = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first + timedelta(days=32)).replace(day=1)


@pytest.mark.parametrize("moment", _MOMENTS, ids=lambda m: m.isoformat())
async def test_budget_window_matches_the_calendar(
    moment: datetime, clean_redis: str, make_client: ClientFactory
) -> None:
    client = make_client(clean_redis)
    source = script_source("limits_status.lua").split("-- Current usage")[0] + _PROBE
    ms = int(moment.timestamp() * 1000)
    day, day_end = await client.eval(source, 0, "day", ms)
    month, month_end = await client.eval(source, 0, "month", ms)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    assert (day.decode(), day_end) == (
        moment.strftime("%Y-%m-%d"),
        int(midnight.timestamp() * 1000),
    )
    assert (month.decode(), month_end) == (
        moment.strftime("%Y-%m"),
        int(_month_end(moment).timestamp() * 1000),
    )
    week, week_end = await client.eval(source, 0, "week", ms)
    year, number, weekday = moment.isocalendar()
    next_monday = midnight + timedelta(days=7 - weekday)
    assert (week.decode(), week_end) == (
        f"{year:04d}-W{number:02d}",
        int(next_monday.timestamp() * 1000),
    )


async def test_works_with_decoded_responses(clean_redis: str) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(clean_redis, decode_responses=True)
    try:
        limiter = Limiter(client)
        limits = KeyLimits(rpm=3, budget_nanos=usd_to_nanos(1), budget_period="day")
        held = await limiter.reserve(
            "k", limits, tokens=1, cost_nanos=usd_to_nanos(0.5), request_id="r"
        )
        assert held.budget_window == datetime.fromtimestamp(held.at, UTC).strftime("%Y-%m-%d")
        assert await limiter.settle(held, tokens=1, cost_nanos=usd_to_nanos(0.25))
        status = await limiter.status("k", limits)
        assert status["budget"]["spent_nanos"] == usd_to_nanos(0.25)
        assert status["requests"]["remaining"] == 2
    finally:
        await client.aclose()
