"""A gateway in front of the native loopback upstreams (OpenAI, Azure OpenAI, Anthropic), for
the front-door tests: one per module, with an API key."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from native_gateway import KEY_ENV, native_fleet, native_policy
from native_upstreams import NativeFleet


@dataclass
class NativeGateway:
    gateway: RunningGateway
    fleet: NativeFleet
    key_id: str
    key: str


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[NativeGateway]:
    root: Path = tmp_path_factory.mktemp("native")
    with pytest.MonkeyPatch.context() as env, native_fleet() as fleet:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        policy = root / "routing_rules.yaml"
        policy.write_text(native_policy(fleet))
        settings = make_settings(root / "data", policy, redis_url, max_upload_bytes=256 * 1024)
        with GatewayThread(settings) as gateway:
            key_id, key = gateway.create_key(name="native")
            yield NativeGateway(gateway, fleet, key_id, key)
