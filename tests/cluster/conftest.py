"""Cluster test fixtures: a 3-master loopback Redis Cluster, a fake upstream and its policy.

The gateway-process helpers of ``tests/gateway/test_gw_limits_e2e.py`` are reused, so that
folder is put on the import path (it has no ``__init__``: its modules import by file name).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))

from cluster_support import LoopbackCluster
from test_gw_limits_e2e import GatewayProcess, start_gateways

from gateway.tools.fake_upstream import FakeUpstream, ThreadedFakeUpstream

POLICY = """
providers:
  fake:
    base_url: {base_url}
    timeout_s: 30
models:
  fake-model:
    provider: fake
    price: {{input: 1000, output: 2000}}
  other-model:
    provider: fake
    upstream_model: fake-other
    price: {{input: 3, output: 7}}
"""


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    """Three masters, no replicas: the shared cluster of the functional tests."""
    nodes = LoopbackCluster(tmp_path_factory.mktemp("cluster"), masters=3).start()
    try:
        yield nodes
    finally:
        nodes.stop()


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
    path = tmp_path_factory.mktemp("cluster-policy") / "routing_rules.yaml"
    path.write_text(POLICY.format(base_url=cluster_upstream.base_url))
    return path


@pytest.fixture(scope="session")
def gateways(
    tmp_path_factory: pytest.TempPathFactory, cluster: LoopbackCluster, cluster_policy: Path
) -> Iterator[list[GatewayProcess]]:
    """Three gateway processes sharing the cluster (limits closed on Redis failure)."""
    running = start_gateways(
        3, cluster.url, tmp_path_factory.mktemp("cluster-gateways"), cluster_policy, "closed"
    )
    try:
        yield running
    finally:
        for gateway in running:
            gateway.stop()
