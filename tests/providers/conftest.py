"""Fixtures for the provider tests: a tiny Qwen3 checkpoint, a loopback upstream to spill to,
and real gateways (uvicorn on 127.0.0.1, their own thread) serving both."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_upstream import FakeUpstream, ThreadedFakeUpstream
from gateway_runner import GatewayThread, RunningGateway, make_settings
from local_policy import local_policy

from gateway.settings import Settings


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_checkpoint import write_tiny_checkpoint

    # A long context, so held streams (ignore_eos) run for as long as a test needs them.
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "tiny-qwen3", arch="qwen3", max_position_embeddings=32768
    )


@pytest.fixture(scope="session")
def tokenizer(checkpoint: Path) -> Any:
    from engine.tokenizer import Tokenizer

    return Tokenizer(checkpoint)


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    with ThreadedFakeUpstream() as fake:
        yield fake


def gateway_settings(root: Path, policy_text: str, redis_url: str) -> Settings:
    """Settings of a test gateway serving ``policy_text`` with its data under ``root``."""
    policy = root / "routing_rules.yaml"
    policy.write_text(policy_text)
    # The engine works for seconds, and prompts may be long: the defaults, not the tests'.
    return make_settings(
        root / "data",
        policy,
        redis_url,
        upstream_read_timeout_s=60.0,
        max_body_bytes=4 * 1024 * 1024,
    )


def start_local_gateway(settings: Settings) -> tuple[GatewayThread, RunningGateway]:
    runner = GatewayThread(settings, start_timeout_s=120)  # the engine loads before serving
    return runner, runner.start()


@pytest.fixture(scope="module")
def local_gateway(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoint: Path,
    upstream: FakeUpstream,
    redis_url: str,
) -> Iterator[RunningGateway]:
    policy = local_policy(
        checkpoint,
        upstream.base_url,
        spill_when={"waiting": 0},
        up_price={"input": 1, "output": 1},
        max_num_seqs=2,
        max_num_batched_tokens=256,
        kv_cache_bytes=64 * 1024 * 1024,
    )
    settings = gateway_settings(tmp_path_factory.mktemp("local-gw"), policy, redis_url)
    runner, gateway = start_local_gateway(settings)
    try:
        yield gateway
    finally:
        runner.stop()


@pytest.fixture
def api_key(local_gateway: RunningGateway) -> str:
    return local_gateway.create_key(name="local-test")[1]


@pytest.fixture(scope="module")
def start_gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[Callable[[str], tuple[RunningGateway, str]]]:
    """Starts a gateway on a policy of the test's own: (gateway, an API key); stopped after."""
    started: list[GatewayThread] = []

    def start(policy_text: str) -> tuple[RunningGateway, str]:
        root = tmp_path_factory.mktemp("local-gw-own")
        runner, gateway = start_local_gateway(gateway_settings(root, policy_text, redis_url))
        started.append(runner)
        return gateway, gateway.create_key(name="local-test")[1]

    try:
        yield start
    finally:
        for runner in started:
            runner.stop()
