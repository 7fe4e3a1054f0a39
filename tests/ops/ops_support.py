"""Helpers for the operations tests: a gateway as a real subprocess (``python -m gateway serve``)
with its stdout/stderr captured to a file, and the secrets those tests look for in its output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.store.embedded import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
# Distinctive values, so that finding one in the captured output can only mean a leak.
ADMIN_KEY = "sy-admin-OPSSECRET-admin-0123456789"
PEPPER = "OPSSECRET-pepper-abcdef0123456789"
PROVIDER_KEY = "sk-provider-OPSSECRET-9876543210"
# The session Redis is shared: every gateway on it must use one pepper (a gateway whose
# pepper differs from the fingerprint in Redis refuses to start).
SESSION_REDIS_PEPPER = "test-pepper-0123456789abcdef"

POLICY = """
providers:
  fake:
    base_url: {base_url}
    api_key_env: OPS_TEST_PROVIDER_KEY
    timeout_s: 30
models:
  fake-model:
    provider: fake
    price: {{input: 1000, output: 2000}}
  drip-model:
    provider: fake
    upstream_model: drip
    price: {{input: 1000, output: 2000}}
  embed-model:
    provider: fake
    price: {{input: 100}}
  image-model:
    provider: fake
aliases:
  fake: fake-model
"""


def write_policy(directory: Path, upstream_base_url: str) -> Path:
    path = directory / "routing_rules.yaml"
    path.write_text(POLICY.format(base_url=upstream_base_url))
    return path


class GatewayProcess:
    """``python -m gateway serve`` on a free port; output goes to ``log_path``."""

    def __init__(self, data_dir: Path, policy_file: Path, **settings: Any) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.log_path = data_dir / "gateway.log"
        self.env = {
            key: value for key, value in os.environ.items() if not key.startswith("SWITCHYARD_")
        }
        self.env.update(
            {
                "SWITCHYARD_HOST": "127.0.0.1",
                "SWITCHYARD_PORT": str(self.port),
                "SWITCHYARD_DATA_DIR": str(data_dir),
                "SWITCHYARD_POLICY_FILE": str(policy_file),
                "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
                "SWITCHYARD_KEY_PEPPER": PEPPER,
                "OPS_TEST_PROVIDER_KEY": PROVIDER_KEY,
                "PYTHONUNBUFFERED": "1",
            }
        )
        for name, value in settings.items():
            self.env[f"SWITCHYARD_{name.upper()}"] = str(value)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def start(self, timeout_s: float = 30.0) -> GatewayProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        # cwd is the data dir: no stray .env of the checkout is read.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve"],
            cwd=self.data_dir,
            env={**self.env, "PYTHONPATH": str(REPO_ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited on start-up:\n{self.output()}")
            try:
                if httpx.get(self.base_url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gateway not ready in {timeout_s} s:\n{self.output()}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

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


class ThreadGateway:
    """The app on uvicorn with the guarded protocol, on a thread of the test process."""

    def __init__(self, settings: Any) -> None:
        import io
        import threading

        import uvicorn

        from gateway.app import create_app
        from gateway.server.http_guard import HttpGuardSettings, guarded_protocol

        self.settings = settings
        self.port = free_port()
        self.log = io.BytesIO()
        self.app = create_app(settings, log_stream=self.log)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            loop="asyncio",
            http=guarded_protocol(
                HttpGuardSettings.from_settings(settings), self.app.state.record_wire_rejection
            ),
            timeout_keep_alive=settings.keep_alive_timeout_s,
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadGateway:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start:\n" + self.log.getvalue().decode())
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)

    def create_key(self, **fields: Any) -> tuple[str, str]:
        response = httpx.post(
            self.base_url + "/admin/keys",
            json=fields,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert response.status_code == 201, response.text
        return response.json()["id"], response.json()["key"]


def thread_settings(data_dir: Path, policy_file: Path, redis_url: str, **overrides: Any) -> Any:
    from gateway.settings import Settings

    values: dict[str, Any] = {
        "redis_url": redis_url,
        "data_dir": data_dir,
        "policy_file": policy_file,
        "admin_key": ADMIN_KEY,
        "key_pepper": SESSION_REDIS_PEPPER,
        "upstream_max_tries": 1,
        "max_body_bytes": 64 * 1024,
        # Every test shares the session Redis and 127.0.0.1: the per-address throttle of wrong
        # admin keys (tested in tests/ops/test_ops_admin_sessions.py) must not couple them.
        "auth_failure_limit": 1_000_000,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]
