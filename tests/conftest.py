"""Shared fixtures: a real Redis server process (embedded, or SWITCHYARD_REDIS_URL), Redis
clients like a gateway replica's, a usage ledger and reports on it, a real PostgreSQL server (a
scratch one in a temp dir, or SWITCHYARD_TEST_POSTGRES_URL), and a real gateway in front of the
loopback fake upstream.

Test folders mirror ``gateway/`` and have no ``__init__.py``: pytest puts each test's own folder
on ``sys.path`` (so test file names are unique across the tree), and this file puts
``tests/support`` there: the helpers every folder shares import by name
(``from gateway_runner import GatewayThread``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

# Imported lazily so the engine and kernel tests run where only torch is installed (GPU box).
if TYPE_CHECKING:
    from gateway_runner import RunningGateway
    from redis.asyncio import Redis
    from redis_helpers import ClientFactory

    from gateway.metering.ledger import UsageLedger
    from gateway.metering.reports import UsageReports
    from gateway.store.embedded import EmbeddedRedis
    from gateway.tools.fake_upstream import FakeUpstream


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


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """Builds independent Redis clients, configured like a gateway replica's (separate pools,
    like separate processes), and closes them."""
    from redis_helpers import replica_client

    clients: list[Any] = []

    def build(url: str) -> Any:
        client = replica_client(url)
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.aclose()


@pytest.fixture
async def redis_client(clean_redis: str) -> AsyncIterator[Redis]:
    from redis.asyncio import BlockingConnectionPool, Redis

    # A blocking pool waits for a free connection instead of failing (and spooling) at 64.
    pool = BlockingConnectionPool.from_url(clean_redis, max_connections=64, timeout=20)
    client = Redis(connection_pool=pool)
    yield client
    await client.aclose()


@pytest.fixture
def ledger(redis_client: Redis, tmp_path: Path) -> UsageLedger:
    """The usage ledger on the emptied session Redis (30 days kept)."""
    from gateway.metering.ledger import UsageLedger
    from gateway.metering.spool import Spool

    return UsageLedger(redis_client, spool=Spool(tmp_path / "spool"), retention_days=30)


@pytest.fixture
def reports(redis_client: Redis) -> UsageReports:
    from gateway.metering.reports import UsageReports

    return UsageReports(redis_client, retention_days=30)


@pytest.fixture(scope="session")
def fake_upstream() -> Iterator[FakeUpstream]:
    from gateway.tools.fake_upstream import ThreadedFakeUpstream

    with ThreadedFakeUpstream(slow_s=1.5, drip_s=0.3) as upstream:
        yield upstream


@pytest.fixture(scope="session")
def fake_policy(tmp_path_factory: pytest.TempPathFactory, fake_upstream: FakeUpstream) -> Path:
    """The gateway tests' policy (``gateway_runner.POLICY``) on the fake upstream."""
    from gateway_runner import POLICY, unused_port

    path = tmp_path_factory.mktemp("policy") / "routing_rules.yaml"
    path.write_text(POLICY.format(base_url=fake_upstream.base_url, dead_port=unused_port()))
    return path


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, fake_policy: Path, redis_url: str
) -> Iterator[RunningGateway]:
    """One gateway per test module, on the session Redis."""
    from gateway_runner import GatewayThread, make_settings

    with GatewayThread(make_settings(tmp_path_factory.mktemp("gw"), fake_policy, redis_url)) as gw:
        yield gw


@pytest.fixture
def key(gateway: RunningGateway) -> str:
    """A fresh unlimited key."""
    return gateway.create_key(name="test")[1]
