"""From a fresh state: `switchyard serve` with the shipped policy answers from the local model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gateway.store.embedded import free_port

REPO = Path(__file__).resolve().parents[2]
ADMIN_KEY = "sy-admin-serve-0123456789abcdef"


def _clean_env(data_dir: Path, port: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SWITCHYARD_") and not k.endswith("_API_KEY")
    }
    env.update(
        SWITCHYARD_DATA_DIR=str(data_dir),
        SWITCHYARD_PORT=str(port),
        SWITCHYARD_ADMIN_KEY=ADMIN_KEY,
        SWITCHYARD_LOG_LEVEL="warning",
    )
    return env


def test_serve_with_shipped_policy_answers_from_the_local_model(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"  # empty: no checkpoint, no Redis data, no keys
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve"],
        cwd=REPO,
        env=_clean_env(data_dir, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the gateway did not come up"
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        created = httpx.post(base + "/admin/keys", json={"name": "smoke"}, headers=admin)
        assert created.status_code == 201, created.text
        key = {"Authorization": f"Bearer {created.json()['key']}"}
        reply = httpx.post(
            base + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
            headers=key,
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-switchyard-provider"] == "local"
        body = reply.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert 1 <= body["usage"]["completion_tokens"] <= 8
        card = (data_dir / "models" / "tiny-random-qwen3" / "README.md").read_text()
        assert "random-weight" in card
        models = httpx.get(base + "/v1/models", headers=key).json()["data"]
        local = next(m for m in models if m["id"] == "local-qwen3")
        assert "RANDOM WEIGHTS" in local["description"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()


def test_gateway_without_torch_starts_when_the_policy_has_no_local_provider(tmp_path: Path):
    """The deploy gateway image has no torch: the engine import must stay lazy."""
    script = """
import asyncio, sys
sys.modules["torch"] = None  # any `import torch` now fails
from gateway.app import create_app
from gateway.providers.local_host import LocalEngineHost
from gateway.routing.policy import parse_policy
import gateway.providers.local
policy = parse_policy(
    "providers: {up: {base_url: 'http://127.0.0.1:9/v1'}}\\nmodels: {m: {provider: up}}\\n"
)
host = LocalEngineHost(__import__("pathlib").Path(sys.argv[1]), None, None)
asyncio.run(host.start(policy))
assert host.engine is None and host.provider_name is None
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
