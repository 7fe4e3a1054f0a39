"""x-ratelimit-* headers in OpenAI's format, the key layout and server time."""

from __future__ import annotations

import time

import pytest
from redis.crc import key_slot
from redis_helpers import ClientFactory

from gateway.errors import RateLimited
from gateway.metering.limits import KeyLimits, Limiter, format_duration
from gateway.money import usd_to_nanos


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (20, "20ms"),
        (999, "999ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (59_570, "59.57s"),
        (360_000, "6m0s"),
        (61_250, "1m1.25s"),
        (3_723_000, "1h2m3s"),
    ],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration(ms) == text


async def test_headers_report_limit_remaining_and_reset(
    clean_redis: str, make_client: ClientFactory
) -> None:
    limiter = Limiter(make_client(clean_redis))
    limits = KeyLimits(rpm=5, tpm=1000)
    held = await limiter.reserve("k", limits, tokens=300, cost_nanos=0, request_id="r1")
    headers = held.headers
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "4"
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "700"
    # the window is back to its initial state when this 1 s sub-bucket leaves it: 59-60 s
    for kind in ("requests", "tokens"):
        reset = headers[f"x-ratelimit-reset-{kind}"]
        assert reset.endswith("s") and 59.0 <= float(reset.rstrip("s")) <= 60.0, reset
    assert abs(held.at - time.time()) < 5  # server time, same host here


async def test_limits_a_key_lacks_get_no_headers(
    clean_redis: str, make_client: ClientFactory
) -> None:
    limiter = Limiter(make_client(clean_redis))
    assert (
        await limiter.reserve("k", KeyLimits(), tokens=5, cost_nanos=0, request_id="a")
    ).headers == {}
    only_rpm = await limiter.reserve("k", KeyLimits(rpm=9), tokens=5, cost_nanos=0, request_id="b")
    assert set(only_rpm.headers) == {
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    }
    assert only_rpm.headers["x-ratelimit-remaining-requests"] == "7"  # both requests counted


async def test_refusals_say_which_limit_and_when_to_retry(
    clean_redis: str, make_client: ClientFactory
) -> None:
    limiter = Limiter(make_client(clean_redis))
    limits = KeyLimits(rpm=100, tpm=50)
    await limiter.reserve("k", limits, tokens=40, cost_nanos=0, request_id="r1")
    with pytest.raises(RateLimited) as busy:
        await limiter.reserve("k", limits, tokens=20, cost_nanos=0, request_id="r2")
    assert "tokens per minute (tpm): limit 50" in busy.value.message
    assert busy.value.headers["x-ratelimit-remaining-tokens"] == "10"
    assert 59 <= int(busy.value.headers["retry-after"]) <= 60
    with pytest.raises(RateLimited) as too_big:
        await limiter.reserve("k", limits, tokens=51, cost_nanos=0, request_id="r3")
    assert "Request too large" in too_big.value.message
    assert too_big.value.headers["x-should-retry"] == "false"
    with pytest.raises(RateLimited) as closed:
        await limiter.reserve("k", KeyLimits(rpm=0), tokens=0, cost_nanos=0, request_id="r4")
    assert "limit 0" in closed.value.message
    assert closed.value.body()["error"]["type"] == "rate_limit_exceeded"


async def test_keys_share_one_slot_and_expire(clean_redis: str, make_client: ClientFactory) -> None:
    client = make_client(clean_redis)
    limiter = Limiter(client, key_prefix="sy")
    keys = limiter.keys("team-a")
    assert keys[0] == "sy:{key:team-a}:rpm"
    assert len({key_slot(k.encode()) for k in keys}) == 1
    await limiter.reserve(
        "team-a",
        KeyLimits(rpm=1, tpm=10, budget_nanos=usd_to_nanos(1)),
        tokens=3,
        cost_nanos=usd_to_nanos(0.1),
        request_id="r",
    )
    for key in keys[:4]:
        assert 0 < await client.pttl(key) <= 3 * 3600 * 1000, key
