"""Fixtures for the metering proofs over running gateways: the counting provider, its policy
file and a metered gateway process in front of it; and three gateway replicas on the session
Redis in front of the fake upstream, for the limits shared across replicas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from counting_provider import CountingProvider
from gateway_runner import GatewayProcess
from loopback import ServedOnThread
from replica_load import replicas_on
from usage_workload import metered_gateway, policy_yaml


@pytest.fixture
def provider() -> Iterator[CountingProvider]:
    """A fresh provider per test, so its books hold only that test's requests."""
    with ServedOnThread(CountingProvider()) as counting:
        yield counting


@pytest.fixture
def counting_policy(tmp_path: Path, provider: CountingProvider) -> Path:
    path = tmp_path / "routing_rules.yaml"
    path.write_text(policy_yaml(provider.base_url))
    return path


@pytest.fixture
def gateway(clean_redis: str, counting_policy: Path, tmp_path: Path) -> Iterator[GatewayProcess]:
    """A metered gateway process on the emptied session Redis, in front of ``provider``; it
    stands in for the root conftest's ``gateway`` (in-process, on the fake upstream) here."""
    with metered_gateway(clean_redis, tmp_path / "gw", counting_policy) as running:
        yield running


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, fake_policy: Path, redis_url: str
) -> Iterator[list[GatewayProcess]]:
    """Three gateway processes on the session Redis for the whole module."""
    with replicas_on(redis_url, 3, tmp_path_factory.mktemp("replicas"), fake_policy) as gateways:
        yield gateways
