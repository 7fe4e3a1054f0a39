"""Shared fixtures: a real Redis server process (embedded, or SWITCHYARD_REDIS_URL), Redis
clients like a gateway replica's, a real PostgreSQL server (a scratch one in a temp dir, or
SWITCHYARD_TEST_POSTGRES_URL), the usage pipeline on them (a SQLite usage store, its Redis
buffer, the recorder that records into it, the exporter that empties it into the store, and the
reports on the store), and a real gateway in front of the loopback fake upstream.

Test folders mirror ``gateway/``, ``engine/`` and ``bench/`` and have no ``__init__.py``: pytest
puts each test's own folder on ``sys.path`` (so test file names are unique across the tree), and
pyproject.toml's ``pythonpath`` puts ``tests/support`` there: the helpers every folder shares
(the fake upstream, scratch PostgreSQL, tiny checkpoints, ...) import by name
(``from gateway_runner import GatewayThread``).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Imported lazily so the engine and kernel tests run where only torch is installed (GPU box).
if TYPE_CHECKING:
    from fake_upstream import FakeUpstream
    from gateway_runner import RunningGateway
    from redis.asyncio import Redis
    from redis_helpers import ClientFactory

    from gateway.ledger import UsageStore
    from gateway.metering.buffer import UsageBuffer
    from gateway.metering.exporter import UsageExporter
    from gateway.metering.recorder import UsageRecorder
    from gateway.metering.reports import UsageReports
    from gateway.store.embedded import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Redis for the session. TCP, so that subprocess gateways can share it."""
    from ports import free_port

    from gateway.store.embedded import EmbeddedRedis

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
    from ports import free_port

    from gateway.store.embedded import EmbeddedRedis

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
    from scratch_postgres import ScratchPostgres

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
    import structlog
    from redis_helpers import replica_client

    from gateway.services import close_redis

    async with contextlib.AsyncExitStack() as built:

        def build(url: str) -> Any:
            client = replica_client(url)
            built.push_async_callback(close_redis, client, structlog.get_logger())
            return client

        yield build


@pytest.fixture
async def redis_client(clean_redis: str) -> AsyncIterator[Redis]:
    from redis.asyncio import BlockingConnectionPool, Redis

    # A blocking pool waits for a free connection instead of failing (and spooling) at 64.
    pool = BlockingConnectionPool.from_url(clean_redis, max_connections=64, timeout=20)
    client = Redis(connection_pool=pool)
    yield client
    await client.aclose()


@pytest.fixture
async def usage_store(tmp_path: Path) -> AsyncIterator[UsageStore]:
    """A fresh embedded usage store (SQLite, 30 days kept)."""
    from gateway.ledger import open_store

    store = await open_store("", data_dir=tmp_path / "store", retention_days=30)
    yield store
    await store.close()


@pytest.fixture
def usage_buffer(redis_client: Redis, usage_store: UsageStore) -> UsageBuffer:
    """The Redis buffer of ``usage_store``, on the emptied session Redis."""
    from gateway.metering.buffer import UsageBuffer

    buffer = UsageBuffer(redis_client)
    buffer.bind(usage_store.store_id)
    return buffer


@pytest.fixture
def recorder(usage_buffer: UsageBuffer, tmp_path: Path) -> UsageRecorder:
    """The usage recorder recording into ``usage_buffer`` (spool under tmp_path)."""
    from gateway.metering.recorder import UsageRecorder
    from gateway.metering.spool import Spool

    return UsageRecorder(usage_buffer, spool=Spool(tmp_path / "spool"))


@pytest.fixture
def exporter(usage_buffer: UsageBuffer, usage_store: UsageStore) -> UsageExporter:
    """An exporter of ``usage_buffer`` into ``usage_store``, driven by the test
    (``await exporter.drain()``), not started."""
    import structlog

    from gateway.metering.exporter import UsageExporter
    from gateway.metrics import Metrics
    from gateway.settings import ExportSettings

    return UsageExporter(
        usage_buffer, usage_store, ExportSettings(), Metrics(), structlog.get_logger()
    )


@pytest.fixture
def reports(usage_store: UsageStore, usage_buffer: UsageBuffer) -> UsageReports:
    from gateway.metering.reports import UsageReports

    return UsageReports(usage_store, usage_buffer)


@pytest.fixture(scope="session")
def fake_upstream() -> Iterator[FakeUpstream]:
    from fake_upstream import ThreadedFakeUpstream

    with ThreadedFakeUpstream(slow_s=1.5, drip_s=0.3) as upstream:
        yield upstream


@pytest.fixture(scope="session")
def fake_policy(tmp_path_factory: pytest.TempPathFactory, fake_upstream: FakeUpstream) -> Path:
    """The gateway tests' policy (``gateway_runner.POLICY``) on the fake upstream."""
    from gateway_runner import write_policy

    return write_policy(tmp_path_factory.mktemp("policy"), fake_upstream.base_url)


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


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """Cyclic garbage found while the test runs, kept for inspection instead of freed."""
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        gc.collect()
