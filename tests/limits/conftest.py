"""Redis clients for the limiter tests: one per simulated gateway replica."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

ClientFactory = Callable[[str], redis.asyncio.Redis]


def replica_client(url: str) -> redis.asyncio.Redis:
    """A client configured like a gateway's: short timeouts, one immediate retry."""
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=1.0,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 1),
        max_connections=200,
    )


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """Builds independent clients (separate pools, like separate processes) and closes them."""
    clients: list[redis.asyncio.Redis] = []

    def build(url: str) -> redis.asyncio.Redis:
        client = replica_client(url)
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.aclose()
