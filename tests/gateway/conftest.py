"""Gateway test fixtures: a loopback fake upstream, a policy naming it, and real gateways."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_runner import POLICY, GatewayThread, RunningGateway, make_settings, unused_port

from gateway.tools.fake_upstream import FakeUpstream, ThreadedFakeUpstream


@pytest.fixture(scope="session")
def fake_upstream() -> Iterator[FakeUpstream]:
    with ThreadedFakeUpstream(slow_s=1.5, drip_s=0.3) as upstream:
        yield upstream


@pytest.fixture(scope="session")
def policy_file(tmp_path_factory: pytest.TempPathFactory, fake_upstream: FakeUpstream) -> Path:
    path = tmp_path_factory.mktemp("policy") / "routing_rules.yaml"
    path.write_text(POLICY.format(base_url=fake_upstream.base_url, dead_port=unused_port()))
    return path


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, policy_file: Path, redis_url: str
) -> Iterator[RunningGateway]:
    """One gateway per test module, on the session Redis."""
    settings = make_settings(tmp_path_factory.mktemp("gw"), policy_file, redis_url)
    runner = GatewayThread(settings)
    running = runner.start()
    try:
        yield running
    finally:
        runner.stop()


@pytest.fixture
def key(gateway: RunningGateway) -> str:
    """A fresh unlimited key."""
    return gateway.create_key(name="test")[1]
