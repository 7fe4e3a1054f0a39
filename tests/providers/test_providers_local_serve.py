"""From a fresh state: `switchyard serve` with the shipped policy answers from the local model,
the bundled real SmolLM2-135M-Instruct, through the official openai SDK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
from ports import free_port

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
        client = openai.OpenAI(base_url=base + "/v1", api_key=created.json()["key"], timeout=60)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        # "auto": the default chat task, whose paid candidates have no keys here
        reply = client.chat.completions.with_raw_response.create(
            model="auto", messages=question, max_tokens=32, temperature=0
        )
        assert reply.headers["x-switchyard-provider"] == "local"
        body = reply.parse()
        assert body.model == "smollm2-135m-instruct"
        assert "Paris" in body.choices[0].message.content
        assert body.choices[0].finish_reason == "stop"
        assert 1 <= body.usage.completion_tokens <= 32
        stream = client.chat.completions.create(
            model="local", messages=question, max_tokens=32, temperature=0, stream=True
        )
        streamed = "".join(
            chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
        )
        assert streamed == body.choices[0].message.content
        view = data_dir / "models" / "SmolLM2-135M-Instruct.Q4_1"
        assert (view / "config.json").is_file() and (view / "tokenizer.json").is_file()
        models = client.models.list().data
        local = next(m for m in models if m.id == "local-smollm2")
        assert "RANDOM WEIGHTS" not in (local.model_extra.get("description") or "")
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
from gateway.policy import parse_policy
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
