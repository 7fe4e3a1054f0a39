"""What the failed-credential throttle counts by, on the session Redis: an IPv6 client is
counted by its /64, so a host cannot take a fresh address from its prefix for each guess;
an IPv4-mapped IPv6 address is its IPv4 address."""

from __future__ import annotations

import pytest
import structlog
from redis.asyncio import Redis

from gateway.access.throttle import AuthThrottle, counted_address
from gateway.errors import RateLimited
from gateway.settings import ThrottleSettings

LIMIT = 3


def _throttle(redis_client: Redis, prefix: str) -> AuthThrottle:
    log = structlog.get_logger("test")
    return AuthThrottle(
        redis_client, ThrottleSettings(limit=LIMIT, window_s=3600), log=log, prefix=prefix
    )


async def test_an_ipv6_prefix_is_one_guesser(redis_client: Redis) -> None:
    throttle = _throttle(redis_client, "sy:test:authfail6:")
    for host in range(1, LIMIT + 1):
        address = f"2001:db8:7:1::{host:x}"
        await throttle.check(address)
        await throttle.failed(address, "admin_bearer")
    with pytest.raises(RateLimited):  # another address of the same /64
        await throttle.check("2001:db8:7:1:ffff:ffff:ffff:fffe")
    await throttle.check("2001:db8:7:2::1")  # the next /64 is someone else


async def test_ipv4_clients_count_each_address(redis_client: Redis) -> None:
    throttle = _throttle(redis_client, "sy:test:authfail4:")
    for _ in range(LIMIT):
        await throttle.failed("::ffff:192.0.2.9", "dashboard_login")
    with pytest.raises(RateLimited):
        await throttle.check("192.0.2.9")
    await throttle.check("192.0.2.10")


def test_counted_address_forms() -> None:
    assert counted_address("2001:DB8::1") == "2001:db8::/64"
    assert counted_address("::1") == "::/64"
    assert counted_address("203.0.113.7") == "203.0.113.7"
    assert counted_address("unknown") == "unknown"
    assert counted_address("x" * 500) == "x" * 100
