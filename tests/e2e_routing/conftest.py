"""Issue 4 end to end: a real gateway (uvicorn thread, real Redis) in front of three scripted
loopback providers, driven with the official openai SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from fake_provider import FakeProviderFleet
from gateway_runner import GatewayThread, make_settings
from route_rig import RouteRig, base_policy


@pytest.fixture(scope="session")
def fleet() -> Iterator[FakeProviderFleet]:
    with FakeProviderFleet("alpha", "beta", "gamma") as providers:
        yield providers


@pytest.fixture(scope="module")
def route_rig(
    tmp_path_factory: pytest.TempPathFactory, fleet: FakeProviderFleet, redis_url: str
) -> Iterator[RouteRig]:
    folder = tmp_path_factory.mktemp("e2e-routing")
    policy_path = folder / "routing_rules.yaml"
    policy_path.write_text(yaml.safe_dump(base_policy(fleet), sort_keys=False))
    settings = make_settings(
        folder,
        policy_path,
        redis_url,
        upstream_read_timeout_s=0.6,
        upstream_connect_timeout_s=0.5,
        upstream_max_tries=2,
        upstream_retry_budget_s=6.0,
    )
    runner = GatewayThread(settings)
    running = runner.start()
    try:
        yield RouteRig(running, fleet, policy_path)
    finally:
        runner.stop()


@pytest.fixture
def rig(route_rig: RouteRig) -> RouteRig:
    route_rig.reset()
    return route_rig
