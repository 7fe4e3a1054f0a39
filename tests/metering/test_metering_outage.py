"""Redis down: LimiterUnavailable fast; Redis back: the same Limiter works again."""

from __future__ import annotations

import time

import pytest
from redis_helpers import ClientFactory

from gateway.errors import ServiceUnavailable
from gateway.metering.limits import KeyLimits, Limiter, LimiterUnavailable
from gateway.money import usd_to_nanos
from gateway.store.embedded import EmbeddedRedis


async def test_outage_raises_fast_and_recovery_needs_no_rebuild(
    own_redis: EmbeddedRedis, make_client: ClientFactory
) -> None:
    client = make_client(own_redis.url)
    limiter = Limiter(client)
    limits = KeyLimits(rpm=10, tpm=100, budget_nanos=usd_to_nanos(1.0))
    before = await limiter.reserve(
        "k", limits, tokens=5, cost_nanos=usd_to_nanos(0.1), request_id="r1"
    )

    own_redis.kill()
    started = time.monotonic()
    with pytest.raises(LimiterUnavailable) as down:
        await limiter.reserve("k", limits, tokens=5, cost_nanos=usd_to_nanos(0.1), request_id="r2")
    assert time.monotonic() - started < 3
    assert isinstance(down.value, ServiceUnavailable) and down.value.status == 503
    with pytest.raises(LimiterUnavailable):
        await limiter.settle(before, tokens=5, cost_nanos=usd_to_nanos(0.1))
    with pytest.raises(LimiterUnavailable):
        await limiter.status("k", limits)

    own_redis.start()  # an empty script cache: EVALSHA gets NOSCRIPT and falls back to loading
    after = await limiter.reserve(
        "k", limits, tokens=5, cost_nanos=usd_to_nanos(0.1), request_id="r3"
    )
    assert after.headers["x-ratelimit-limit-requests"] == "10"
    async with client.pipeline(transaction=True) as pipe:
        limiter.add_settle(pipe, after, tokens=4, cost_nanos=usd_to_nanos(0.05))
        assert await pipe.execute() == [[1]]  # applied, no alert crossed
    status = await limiter.status("k", limits)
    assert status["budget"]["spent_nanos"] >= usd_to_nanos(0.05)


async def test_pipelined_settle_survives_a_flushed_script_cache(
    clean_redis: str, make_client: ClientFactory
) -> None:
    client = make_client(clean_redis)
    limiter = Limiter(client)
    limits = KeyLimits(tpm=100)
    held = await limiter.reserve("k", limits, tokens=50, cost_nanos=0, request_id="r1")
    await client.script_flush()
    async with client.pipeline(transaction=False) as pipe:
        limiter.add_settle(pipe, held, tokens=10, cost_nanos=0)
        assert await pipe.execute() == [[1]]  # applied, no alert crossed
    assert (await limiter.status("k", limits))["tokens"]["used"] == 10
