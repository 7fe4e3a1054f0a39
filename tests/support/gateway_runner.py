"""Real gateways for the tests, and the admin client every test uses on them.

``GatewayThread`` runs ``create_app(settings)`` under uvicorn on 127.0.0.1, on its own thread and
event loop, so the official openai SDK (sync or async) talks to it over TCP exactly as a client
would, and the test can look at its services. ``GatewayProcess`` runs ``python -m gateway
serve`` (what an operator runs: killable with SIGKILL, its output captured to a file). Both
answer ``admin()`` (an httpx client with the admin bearer) and ``create_key(**fields)``.
"""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from ports import free_port
from serve_process import launch_serve, serve_env

from gateway.app import create_app
from gateway.server.http_guard import guarded_protocol
from gateway.server.proxies import proxy_options
from gateway.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "sy-admin-test-0123456789abcdef"
# The session Redis is shared: every gateway on it must use one pepper (a gateway whose
# pepper differs from the fingerprint in Redis refuses to start).
PEPPER = "test-pepper-0123456789abcdef"

# The policy of the gateway tests: models on the fake upstream (fake_upstream.py beside this),
# whose upstream model name picks a behaviour, and one on a port nothing listens on.
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
  burst-model:
    provider: fake
    upstream_model: burst
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


def write_policy(directory: Path, upstream_base_url: str) -> Path:
    """``POLICY`` on the upstream at ``upstream_base_url``, as ``directory/routing_rules.yaml``."""
    path = directory / "routing_rules.yaml"
    path.write_text(POLICY.format(base_url=upstream_base_url, dead_port=free_port()))
    return path


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
        # admin keys (tested in tests/access/test_access_sessions.py) must not couple them.
        "auth_failure_limit": 1_000_000,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


class AdminClient:
    """The admin side of a running gateway: ``base_url`` and ``admin_key`` are its own."""

    base_url: str
    admin_key: str = ADMIN_KEY

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )

    def create_key(self, **fields: Any) -> tuple[str, str]:
        """A new API key with ``fields``: (its id, the key)."""
        with self.admin() as client:
            response = client.post("/admin/keys", json=fields)
        assert response.status_code == 201, response.text
        body = response.json()
        return body["id"], body["key"]

    def wait_exported(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait until the exporter has moved every buffered usage event into the store (the
        reports say ``pending_export: 0``): a report read after that counts every request
        answered before. Returns the freshness fields of the last look."""
        deadline = time.monotonic() + timeout_s
        with self.admin() as client:
            while True:
                body = client.get("/admin/usage/events", params={"limit": 1}).json()
                if body["pending_export"] == 0:
                    return {name: body[name] for name in ("as_of", "pending_export")}
                assert time.monotonic() < deadline, f"export did not catch up: {body}"
                time.sleep(0.05)


@dataclass
class RunningGateway(AdminClient):
    settings: Settings
    base_url: str
    log: io.StringIO
    app: Any

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    @property
    def admin_key(self) -> str:  # type: ignore[override]
        secret = self.settings.admin_key
        return secret.get_secret_value() if secret is not None else ADMIN_KEY

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
    """uvicorn serving ``create_app(settings)`` on a thread; ``start``/``stop`` may repeat.

    ``guarded``: uvicorn runs the gateway's guarded HTTP protocol (client deadlines and size
    limits, keep-alive timeout), as ``switchyard serve`` does."""

    def __init__(
        self, settings: Settings, *, guarded: bool = False, start_timeout_s: float = 20
    ) -> None:
        self.settings = settings
        self.guarded = guarded
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.log = _LogBuffer()
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self.app: Any = None

    def start(self) -> RunningGateway:
        self.app = create_app(self.settings, log_stream=self.log)
        options: dict[str, Any] = {"http": "httptools"}
        if self.guarded:
            guard = self.settings.http_guard
            options = {
                "http": guarded_protocol(guard, self.app.state.record_wire_rejection),
                "timeout_keep_alive": self.settings.keep_alive_timeout_s,
            }
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            loop="asyncio",
            log_level="warning",
            access_log=False,
            lifespan="on",
            **proxy_options(self.settings),
            **options,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start:\n" + self.log.getvalue())
            time.sleep(0.01)
        return RunningGateway(self.settings, f"http://127.0.0.1:{self.port}", self.log, self.app)

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(30)
        self.server = None
        self.thread = None

    def __enter__(self) -> RunningGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GatewayProcess(AdminClient):
    """``python -m gateway serve`` on a free port, run from ``data_dir`` (no stray .env of the
    checkout is read); its output goes to ``log_path``. ``settings`` become ``SWITCHYARD_*``
    variables (``redis_url`` unset: the embedded Redis); ``env`` is added as given."""

    def __init__(
        self,
        data_dir: Path,
        policy_file: Path,
        *,
        admin_key: str = ADMIN_KEY,
        pepper: str = PEPPER,
        env: dict[str, str] | None = None,
        **settings: Any,
    ) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.admin_key = admin_key
        self.log_path = data_dir / f"gateway-{self.port}.log"
        self.env = serve_env(
            {
                "SWITCHYARD_HOST": "127.0.0.1",
                "SWITCHYARD_PORT": str(self.port),
                "SWITCHYARD_DATA_DIR": str(data_dir),
                "SWITCHYARD_POLICY_FILE": str(policy_file),
                "SWITCHYARD_ADMIN_KEY": admin_key,
                "SWITCHYARD_KEY_PEPPER": pepper,
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(REPO_ROOT),
                **(env or {}),
            }
        )
        for name, value in settings.items():
            self.env[f"SWITCHYARD_{name.upper()}"] = str(value)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:  # type: ignore[override]
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base_url

    def launch(self) -> GatewayProcess:
        """Start the process without waiting for it (``wait_ready`` does)."""
        self.process = launch_serve(self.env, self.data_dir, self.log_path)
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> GatewayProcess:
        assert self.process is not None
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

    def start(self, timeout_s: float = 30.0) -> GatewayProcess:
        return self.launch().wait_ready(timeout_s)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_gateways(
    count: int, data_dir: Path, policy_file: Path, **settings: Any
) -> Iterator[list[GatewayProcess]]:
    """``count`` gateway processes sharing ``data_dir`` (so an external Redis: ``redis_url``),
    started together, each waited for, all stopped at the end of the block."""
    gateways = [GatewayProcess(data_dir, policy_file, **settings) for _ in range(count)]
    try:
        for gateway in gateways:
            gateway.launch()
        for gateway in gateways:
            gateway.wait_ready()
        yield gateways
    finally:
        for gateway in gateways:
            gateway.stop()
