"""Settles and usage records go to Redis as EVALSHA: an empty script cache (SCRIPT FLUSH, or a
Redis restart) between requests must neither lose nor double-count anything."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
import redis.asyncio
from gw_support import GatewayThread, RunningGateway, make_settings

from gateway.limits import KeyLimits, Limiter
from gateway.money import usd_to_nanos
from gateway.redis_embedded import EmbeddedRedis

HI = [{"role": "user", "content": "x" * 24}]
LIMITS = KeyLimits(rpm=1000, tpm=1_000_000, budget_nanos=usd_to_nanos(100.0), budget_period="day")


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _create_limited_key(gateway: RunningGateway) -> tuple[str, str]:
    return gateway.create_key(
        name="script-cache",
        rpm=LIMITS.rpm,
        tpm=LIMITS.tpm,
        budget_usd=100.0,
        budget_period=LIMITS.budget_period,
    )


def _usage(gateway: RunningGateway, key: str) -> dict:
    response = httpx.get(gateway.v1 + "/usage", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


async def _ask(client: openai.AsyncOpenAI, max_tokens: int, stream: bool) -> int:
    """One request; returns the total tokens the upstream reported."""
    if not stream:
        answer = await client.chat.completions.create(
            model="fake",
            messages=HI,  # type: ignore[arg-type]
            max_tokens=max_tokens,
        )
        assert answer.usage is not None
        return answer.usage.total_tokens
    total = 0
    chunks = await client.chat.completions.create(
        model="fake",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in chunks:
        if chunk.usage is not None:
            total = chunk.usage.total_tokens
    assert total > 0
    return total


async def _assert_books(
    redis_url: str, gateway: RunningGateway, key_id: str, key: str, requests: int, tokens: int
) -> None:
    """Every request settled exactly once and recorded exactly once."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        status = await Limiter(client).status(key_id, LIMITS)
    finally:
        await client.aclose()
    assert status["in_flight"] == 0  # no reservation left unsettled
    assert status["budget"]["reserved_nanos"] == 0
    assert status["requests"]["used"] == requests
    assert status["tokens"]["used"] == tokens  # estimates replaced by what was used, once
    usage = _usage(gateway, key)
    assert usage["requests"] == requests
    assert usage["total_tokens"] == tokens
    assert status["budget"]["spent_nanos"] == usage["total_cost_nanos"]
    assert gateway.services.ledger.spool_depth() == 0  # nothing fell back to the spool


async def test_script_flush_between_requests_loses_and_doubles_nothing(
    gateway: RunningGateway, redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    key_id, key = _create_limited_key(gateway)
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    tokens = 0
    for index in range(6):
        await redis_client.script_flush()  # the next settle and record get NOSCRIPT
        tokens += await _ask(client, max_tokens=3 + index, stream=index % 2 == 1)
    await client.close()
    await _assert_books(redis_url, gateway, key_id, key, requests=6, tokens=tokens)


async def test_redis_restart_between_requests_loses_and_doubles_nothing(
    own_redis: EmbeddedRedis, policy_file: Path, tmp_path: Path
) -> None:
    runner = GatewayThread(make_settings(tmp_path / "gw", policy_file, own_redis.url))
    gateway = runner.start()
    try:
        key_id, key = _create_limited_key(gateway)
        client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
        tokens = await _ask(client, max_tokens=4, stream=False)
        own_redis.kill()
        own_redis.start()  # the data survives (append-only file), the script cache does not
        tokens += await _ask(client, max_tokens=5, stream=False)
        tokens += await _ask(client, max_tokens=6, stream=True)
        await client.close()
        await _assert_books(own_redis.url, gateway, key_id, key, requests=3, tokens=tokens)
    finally:
        runner.stop()
