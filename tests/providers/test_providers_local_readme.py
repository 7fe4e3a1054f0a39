"""The README's examples, as written (no temperature, no max_tokens), 10 times each, against
`switchyard serve` on the shipped policy with no provider keys: every one is served by the
bundled SmolLM2-135M-Instruct (`local` directly; `cheap` after its paid candidates are skipped)
and answers sensibly: Paris for the capital, an answer that ends on its own well within the
CPU's 256-token default. The official openai and anthropic SDKs as clients."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from ports import free_port

# the model loads in a minute on a quiet box; 60 answers of a 135M model on 2 busy cores
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
ADMIN_KEY = "sy-admin-readme-0123456789abcdef"
RUNS = 10
CPU_LIMIT = 256
WORDS = re.compile(r"[A-Za-z]+")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, API key) of a fresh `switchyard serve` on the shipped routing_rules.yaml."""
    data_dir = tmp_path_factory.mktemp("readme") / "data"
    port = free_port()
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
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the gateway did not come up"
            try:
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        created = httpx.post(
            base + "/admin/keys",
            json={"name": "readme"},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert created.status_code == 201, created.text
        yield base, created.json()["key"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()


def ten(call: Any) -> list[Any]:
    """RUNS answers of ``call``, sent at once (the engine batches them)."""
    with ThreadPoolExecutor(RUNS) as pool:
        return list(pool.map(lambda _: call(), range(RUNS)))


def sensible(text: str) -> bool:
    """Words, not a token soup: mostly ASCII letters, a few real words, no endless repeat."""
    words = WORDS.findall(text)
    return len(words) >= 2 and len(set(words)) >= len(words) / 3


def oai(gateway: tuple[str, str]) -> openai.OpenAI:
    base, key = gateway
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)


def test_the_capital_of_france_is_paris_ten_times_in_ten(gateway) -> None:
    client = oai(gateway)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    replies = ten(
        lambda: client.chat.completions.with_raw_response.create(model="local", messages=question)
    )
    for raw in replies:
        assert raw.headers["x-switchyard-provider"] == "local"
        reply = raw.parse()
        assert "Paris" in reply.choices[0].message.content, reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage.completion_tokens < CPU_LIMIT


def test_cheap_falls_back_to_the_local_model_and_answers_hello(gateway) -> None:
    # `cheap` is gpt-4.1-mini, then gemini-2.5-flash: no keys here, so the local model serves
    client = oai(gateway)
    hello = [{"role": "user", "content": "Hello"}]
    for raw in ten(
        lambda: client.chat.completions.with_raw_response.create(model="cheap", messages=hello)
    ):
        assert raw.headers["x-switchyard-provider"] == "local"
        reply = raw.parse()
        text = reply.choices[0].message.content
        assert sensible(text) and reply.choices[0].finish_reason == "stop", text
        assert reply.usage.completion_tokens < CPU_LIMIT


def test_the_readme_sdk_examples_answer_sensibly(gateway) -> None:
    client = oai(gateway)
    hi = [{"role": "user", "content": "Hi"}]
    for reply in ten(lambda: client.chat.completions.create(model="cheap", messages=hi)):
        text = reply.choices[0].message.content
        assert sensible(text) and reply.choices[0].finish_reason == "stop", text

    def count() -> str:
        stream = client.chat.completions.create(
            model="cheap", messages=[{"role": "user", "content": "Count to 5"}], stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    for text in ten(count):
        assert all(str(n) in text for n in range(1, 6)), text

    base, key = gateway
    claude = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=600)
    for message in ten(lambda: claude.messages.create(model="cheap", max_tokens=256, messages=hi)):
        assert sensible(message.content[0].text) and message.stop_reason == "end_turn"
    for response in ten(lambda: client.responses.create(model="cheap", input="Hi")):
        assert sensible(response.output_text), response.output_text
