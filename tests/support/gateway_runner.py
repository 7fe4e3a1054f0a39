"""Helpers for the gateway tests: the test policy, settings, and a real gateway on a thread.

A gateway runs as a real uvicorn server on 127.0.0.1, on its own thread and event loop, so the
official openai SDK (sync or async) talks to it over TCP exactly as a client would.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from gateway.app import create_app
from gateway.settings import Settings
from gateway.store.embedded import free_port

ADMIN_KEY = "sy-admin-test-0123456789abcdef"
# The session Redis is shared: every gateway on it must use one pepper (a gateway whose
# pepper differs from the fingerprint in Redis refuses to start).
PEPPER = "test-pepper-0123456789abcdef"

POLICY = """
providers:
  fake:
    base_url: {base_url}
    timeout_s: 30
  dead:
    base_url: http://127.0.0.1:{dead_port}/v1
    connect_timeout_s: 1
models:
  fake-model:
    provider: fake
    price: {{input: 1000, output: 2000}}
  other-model:
    provider: fake
    upstream_model: fake-other
    price: {{input: 1, output: 1}}
  upstream-400:
    provider: fake
    upstream_model: fail-400
  upstream-500:
    provider: fake
    upstream_model: fail-500
  slow-model:
    provider: fake
    upstream_model: slow
  break-model:
    provider: fake
    upstream_model: break
  drip-model:
    provider: fake
    upstream_model: drip
  dead-model:
    provider: dead
  embed-model:
    provider: fake
    price: {{input: 100}}
  image-model:
    provider: fake
aliases:
  fake: fake-model
  other: other-model
"""


def unused_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_settings(data_dir: Path, policy_file: Path, redis_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "data_dir": data_dir,
        "policy_file": policy_file,
        "admin_key": ADMIN_KEY,
        "key_pepper": PEPPER,
        "upstream_read_timeout_s": 0.5,
        "upstream_max_tries": 1,
        "max_body_bytes": 64 * 1024,
        "auth_cache_ttl_s": 0.5,
        # Every test shares the session Redis and 127.0.0.1: the per-address throttle of wrong
        # admin keys (tested in tests/ops/test_ops_admin_sessions.py) must not couple them.
        "auth_failure_limit": 1_000_000,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@dataclass
class RunningGateway:
    settings: Settings
    base_url: str
    log: io.StringIO
    app: Any

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10
        )

    def create_key(self, **fields: Any) -> tuple[str, str]:
        with self.admin() as client:
            response = client.post("/admin/keys", json=fields)
        assert response.status_code == 201, response.text
        body = response.json()
        return body["id"], body["key"]

    @property
    def services(self) -> Any:
        return self.app.state.services


class _LogBuffer(io.StringIO):
    """A text stream with a .buffer, like stdout, that the JSON logger writes bytes to."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = _BytesSink(self)


class _BytesSink:
    def __init__(self, target: io.StringIO) -> None:
        self.target = target
        self.lock = threading.Lock()

    def write(self, data: bytes) -> int:
        with self.lock:
            self.target.write(data.decode())
        return len(data)

    def flush(self) -> None:
        pass


class GatewayThread:
    """uvicorn serving ``create_app(settings)`` on a thread; ``start``/``stop`` may repeat."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = free_port()
        self.log = _LogBuffer()
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self.app: Any = None

    def start(self) -> RunningGateway:
        self.app = create_app(self.settings, log_stream=self.log)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            loop="asyncio",
            http="httptools",
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start:\n" + self.log.getvalue())
            time.sleep(0.01)
        return RunningGateway(self.settings, f"http://127.0.0.1:{self.port}", self.log, self.app)

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(20)
        self.server = None
        self.thread = None
