"""Shared fixtures: a real Redis server process (embedded, or SWITCHYARD_REDIS_URL) and a real
PostgreSQL server (a scratch one in a temp dir, or SWITCHYARD_TEST_POSTGRES_URL).

Test folders are no packages (``tests/gateway`` must not shadow ``gateway``): pytest puts each
test's own folder on ``sys.path``, and this file puts ``tests/support`` there, so the helpers
every folder shares import by name (``from gateway_runner import GatewayThread``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

# Imported lazily so the engine and kernel tests run where only torch is installed (GPU box).
if TYPE_CHECKING:
    from gateway.store.embedded import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Redis for the session. TCP, so that subprocess gateways can share it."""
    from gateway.store.embedded import EmbeddedRedis, free_port

    external = os.environ.get("SWITCHYARD_REDIS_URL")
    if external:
        yield external
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), port=free_port(), appendonly=False)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def clean_redis(redis_url: str) -> str:
    """The session Redis, emptied before the test."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    client.close()
    return redis_url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A private Redis that the test may kill and restart (outage tests)."""
    from gateway.store.embedded import EmbeddedRedis, free_port

    server = EmbeddedRedis(tmp_path / "redis", port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """One scratch PostgreSQL for the session (initdb + pg_ctl in a temp dir, fsync off), or
    SWITCHYARD_TEST_POSTGRES_URL: a server where the test user may create databases."""
    from gateway.ledger.scratch_postgres import ScratchPostgres

    external = os.environ.get("SWITCHYARD_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    with ScratchPostgres() as server:
        yield server.url


@pytest.fixture
async def postgres_url(postgres_server_url: str) -> AsyncIterator[str]:
    """A fresh, empty database on the session's PostgreSQL, dropped after the test."""
    import uuid
    from urllib.parse import urlsplit

    import asyncpg

    name = f"test_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(postgres_server_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        yield urlsplit(postgres_server_url)._replace(path="/" + name).geturl()
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()
