"""Redis test fixtures: a 3-master loopback Redis Cluster, a fake upstream and the gateway
tests' policy on it, and three gateway processes on the cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fake_upstream import FakeUpstream, ThreadedFakeUpstream
from gateway_runner import GatewayProcess, write_policy
from redis.asyncio.cluster import RedisCluster
from redis_helpers import LoopbackCluster
from replica_load import replicas_on

from gateway.store.connect import connect_redis


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    """Three masters, no replicas: the shared cluster of the functional tests."""
    with LoopbackCluster(tmp_path_factory.mktemp("cluster"), masters=3) as nodes:
        yield nodes


@pytest.fixture(scope="session")
def cluster_upstream() -> Iterator[FakeUpstream]:
    # Keeps every request it saw, so the tests can sum what it served.
    threaded = ThreadedFakeUpstream(keep=100_000)
    with threaded as upstream:
        yield upstream


@pytest.fixture(scope="session")
def cluster_policy(
    tmp_path_factory: pytest.TempPathFactory, cluster_upstream: FakeUpstream
) -> Path:
    return write_policy(tmp_path_factory.mktemp("cluster-policy"), cluster_upstream.base_url)


@pytest.fixture(scope="session")
def gateways(
    tmp_path_factory: pytest.TempPathFactory, cluster: LoopbackCluster, cluster_policy: Path
) -> Iterator[list[GatewayProcess]]:
    """Three gateway processes sharing the cluster (limits closed on Redis failure)."""
    with replicas_on(
        cluster.url, 3, tmp_path_factory.mktemp("gateways"), cluster_policy
    ) as running:
        yield running


@pytest.fixture
async def client(cluster: LoopbackCluster) -> AsyncIterator[RedisCluster]:
    """A gateway's client of the shared cluster."""
    redis = connect_redis(cluster.url, timeout_s=2.0)
    assert isinstance(redis, RedisCluster)
    yield redis
    await redis.aclose()
