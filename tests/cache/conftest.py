"""Fixtures of the response-cache tests: a ResponseCache on the session's real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from gateway.cache import ResponseCache


@pytest.fixture
async def redis_client(clean_redis: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(clean_redis)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def cache(redis_client: redis.asyncio.Redis) -> AsyncIterator[ResponseCache]:
    responses = ResponseCache(redis_client)
    try:
        yield responses
    finally:
        await responses.drain()
