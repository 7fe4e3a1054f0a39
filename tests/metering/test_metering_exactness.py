"""Exactness across replicas: several independent Redis clients, one shared limit."""

from __future__ import annotations

import asyncio
import time

from redis_helpers import ClientFactory

from gateway.errors import RateLimited
from gateway.metering.limits import KeyLimits, Limiter, Reservation


async def _attempt(limiter: Limiter, limits: KeyLimits, tokens: int, request_id: str):
    try:
        return await limiter.reserve(
            "team-a", limits, tokens=tokens, cost_nanos=0, request_id=request_id
        )
    except RateLimited as refusal:
        return refusal


async def test_rpm_exact_with_300_concurrent_reserves_on_3_replicas(
    clean_redis: str, make_client: ClientFactory
) -> None:
    replicas = [Limiter(make_client(clean_redis)) for _ in range(3)]
    limits = KeyLimits(rpm=100)
    outcomes = await asyncio.gather(
        *(_attempt(replicas[i % 3], limits, 0, f"req-{i}") for i in range(300))
    )
    granted = [o for o in outcomes if isinstance(o, Reservation)]
    refused = [o for o in outcomes if isinstance(o, RateLimited)]
    assert len(granted) == 100
    assert len(refused) == 200
    assert {r.code for r in refused} == {"rate_limit_exceeded"}
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert sorted(int(g.headers["x-ratelimit-remaining-requests"]) for g in granted) == list(
        range(100)
    )
    status = await replicas[0].status("team-a", limits)
    assert status["requests"]["used"] == 100
    assert status["requests"]["remaining"] == 0


async def test_tpm_exact_with_token_sized_reserves(
    clean_redis: str, make_client: ClientFactory
) -> None:
    replicas = [Limiter(make_client(clean_redis)) for _ in range(3)]
    limits = KeyLimits(tpm=1000)
    sizes = [5 + (i * 37) % 41 for i in range(300)]
    outcomes = await asyncio.gather(
        *(_attempt(replicas[i % 3], limits, size, f"req-{i}") for i, size in enumerate(sizes))
    )
    granted = [o for o in outcomes if isinstance(o, Reservation)]
    refused = [sizes[i] for i, o in enumerate(outcomes) if isinstance(o, RateLimited)]
    used = sum(g.tokens for g in granted)
    assert used <= 1000
    # each refusal happened because it did not fit then; usage only grew since
    assert refused and used + min(refused) > 1000
    status = await replicas[1].status("team-a", limits)
    assert status["tokens"]["used"] == used


async def test_no_double_burst_at_window_edge(clean_redis: str, make_client: ClientFactory) -> None:
    """A 2 s window in 20 sub-buckets: at most 10 grants in any 1.9 s, and it does slide."""
    replicas = [Limiter(make_client(clean_redis), window_s=2.0, buckets=20) for _ in range(2)]
    limits = KeyLimits(rpm=10)
    grants: list[float] = []
    deadline = time.monotonic() + 4.5
    i = 0
    while time.monotonic() < deadline:
        outcome = await _attempt(replicas[i % 2], limits, 0, f"req-{i}")
        if isinstance(outcome, Reservation):
            grants.append(outcome.at)
        i += 1
        await asyncio.sleep(0.01)
    grants.sort()
    # sub-buckets are 0.1 s: a grant leaves the window between 1.9 s and 2.0 s after it
    for start in grants:
        assert sum(1 for t in grants if start <= t < start + 1.9) <= 10
    assert len(grants) >= 20  # refilled as old sub-buckets slid out, not stuck
    assert len(grants) <= 30


async def test_refusal_waits_for_oldest_sub_bucket(
    clean_redis: str, make_client: ClientFactory
) -> None:
    limiter = Limiter(make_client(clean_redis), window_s=2.0, buckets=20)
    limits = KeyLimits(rpm=2)
    await limiter.reserve("team-a", limits, tokens=0, cost_nanos=0, request_id="a")
    await limiter.reserve("team-a", limits, tokens=0, cost_nanos=0, request_id="b")
    refusal = await _attempt(limiter, limits, 0, "c")
    assert isinstance(refusal, RateLimited)
    assert refusal.headers["retry-after"] == "2"
    assert refusal.headers["x-ratelimit-remaining-requests"] == "0"
    await asyncio.sleep(2.05)
    assert isinstance(await _attempt(limiter, limits, 0, "d"), Reservation)
