"""Fixtures for the local-engine tests: a tiny Qwen3 checkpoint, a loopback upstream to spill
to, and one real gateway (uvicorn on 127.0.0.1, its own thread) serving both."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gateway.app import create_app
from gateway.settings import Settings
from gateway.store.embedded import free_port
from gateway.tools.fake_upstream import FakeUpstream, ThreadedFakeUpstream

ADMIN_KEY = "sy-admin-local-0123456789abcdef"
# The session Redis is shared: every gateway on it must use one pepper (a gateway whose
# pepper differs from the fingerprint in Redis refuses to start).
PEPPER = "test-pepper-0123456789abcdef"

POLICY = """
providers:
  home:
    kind: local
    engine:
      model: {checkpoint}
      device: cpu
      max_num_seqs: 2
      max_num_batched_tokens: 256
      kv_cache_bytes: 67108864
    spill_when: {{waiting: 0}}
  up:
    base_url: {upstream}
models:
  tiny:
    provider: home
    upstream_model: tiny-qwen3
  up-model:
    provider: up
    price: {{input: 1, output: 1}}
tasks:
  mixed:
    strategy: ordered
    candidates: [tiny, up-model]
"""


class _LogBuffer(io.StringIO):
    """A text stream with a .buffer (the JSON logger writes bytes to it)."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = self
        self.lock = threading.Lock()

    def write(self, data: Any) -> int:  # type: ignore[override]
        with self.lock:
            return super().write(data.decode() if isinstance(data, bytes) else data)


class LocalGateway:
    """A real gateway on a thread: ``base_url``, the admin client, and its engine."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = _LogBuffer()
        self.app = create_app(settings, log_stream=self.log)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            loop="asyncio",
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> LocalGateway:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start:\n" + self.log.getvalue())
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    @property
    def engine(self) -> Any:
        return self.app.state.services.local_engine.engine


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.tools.tiny_checkpoint import write_tiny_checkpoint

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
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        redis_url=redis_url,
        data_dir=root / "data",
        policy_file=policy,
        admin_key=ADMIN_KEY,
        key_pepper=PEPPER,
        upstream_max_tries=1,
    )


def create_key(gateway: LocalGateway) -> str:
    import httpx

    response = httpx.post(
        gateway.base_url + "/admin/keys",
        json={"name": "local-test"},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return response.json()["key"]


@pytest.fixture(scope="module")
def local_gateway(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoint: Path,
    upstream: FakeUpstream,
    redis_url: str,
) -> Iterator[LocalGateway]:
    policy = POLICY.format(checkpoint=checkpoint, upstream=upstream.base_url)
    settings = gateway_settings(tmp_path_factory.mktemp("local-gw"), policy, redis_url)
    gateway = LocalGateway(settings).start()
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def api_key(local_gateway: LocalGateway) -> str:
    return create_key(local_gateway)


@pytest.fixture(scope="module")
def start_gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[Callable[[str], tuple[LocalGateway, str]]]:
    """Starts a gateway on a policy of the test's own: (gateway, an API key); stopped after."""
    started: list[LocalGateway] = []

    def start(policy_text: str) -> tuple[LocalGateway, str]:
        root = tmp_path_factory.mktemp("local-gw-own")
        gateway = LocalGateway(gateway_settings(root, policy_text, redis_url)).start()
        started.append(gateway)
        return gateway, create_key(gateway)

    try:
        yield start
    finally:
        for gateway in started:
            gateway.stop()
