"""Fixtures for the usage ledger tests: a ledger and reports over a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import BlockingConnectionPool, Redis

from gateway.metering.ledger import UsageLedger
from gateway.metering.reports import UsageReports
from gateway.metering.spool import Spool


@pytest.fixture
async def redis_client(clean_redis: str) -> AsyncIterator[Redis]:
    # A blocking pool waits for a free connection instead of failing (and spooling) at 64.
    pool = BlockingConnectionPool.from_url(clean_redis, max_connections=64, timeout=20)
    client = Redis(connection_pool=pool)
    yield client
    await client.aclose()


@pytest.fixture
def ledger(redis_client: Redis, tmp_path: Path) -> UsageLedger:
    return UsageLedger(redis_client, spool=Spool(tmp_path / "spool"), retention_days=30)


@pytest.fixture
def reports(redis_client: Redis) -> UsageReports:
    return UsageReports(redis_client, retention_days=30)
