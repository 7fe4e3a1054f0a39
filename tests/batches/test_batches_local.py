"""Batch lines on the in-process engine yield to interactive requests: they fill at most their
share of the engine's sequences, and an interactive request that arrives calls them back (the
engine aborts them; they run again later), while the batch still answers every line once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest
from batch_support import jsonl, wait_until
from gateway_runner import GatewayThread, RunningGateway, make_settings

pytestmark = pytest.mark.engine
LINES = 6
SEQS = 4  # the engine's max_num_seqs; batch lines may fill half of them


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[RunningGateway]:
    pytest.importorskip("torch")
    from tiny_checkpoint import write_tiny_checkpoint

    root: Path = tmp_path_factory.mktemp("batches-local")
    checkpoint = write_tiny_checkpoint(
        root / "tiny-qwen3", arch="qwen3", max_position_embeddings=32768
    )
    policy = root / "routing_rules.yaml"
    policy.write_text(
        f"""
providers:
  home:
    kind: local
    engine: {{model: {checkpoint}, device: cpu, max_num_seqs: {SEQS},
             max_num_batched_tokens: 256, kv_cache_bytes: 67108864}}
models:
  tiny:
    provider: home
    upstream_model: tiny-qwen3
"""
    )
    settings = make_settings(
        root / "data",
        policy,
        redis_url,
        batch_poll_interval_s=0.05,
        batch_concurrency=LINES,
        batch_local_share=0.5,
        upstream_read_timeout_s=60,
    )
    with GatewayThread(settings, start_timeout_s=120) as running:
        yield running


def test_batch_lines_fill_their_share_and_give_way_to_an_interactive_request(
    gateway: RunningGateway,
) -> None:
    _, key = gateway.create_key(name="local-batch")
    client = openai.OpenAI(api_key=key, base_url=gateway.v1, max_retries=0, timeout=120)
    lines = [
        {
            "custom_id": f"long-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "tiny",
                "max_tokens": 300,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": f"count {n}"}],
            },
        }
        for n in range(LINES)
    ]
    data = b"\n".join(orjson.dumps(line) for line in lines)
    uploaded = client.files.create(file=("long.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    engine = gateway.services.local_engine.engine
    most: list[int] = [0]
    stop = threading.Event()

    def sample() -> None:  # the most requests the engine held at once, batch lines alone
        while not stop.is_set():
            load = engine.load()
            most[0] = max(most[0], load["num_requests_running"] + load["num_requests_waiting"])
            time.sleep(0.005)

    wait_until(lambda: engine.load()["num_requests_running"] > 0, 30, "batch lines to run")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.5)
    stop.set()
    sampler.join()
    assert most[0] <= SEQS // 2  # the batch's share, no more
    # Long enough to be seen: the runner looks every 20 ms, and on a loaded box a request of a
    # few tokens could start and end between two looks.
    answer = client.chat.completions.create(
        model="tiny",
        max_tokens=64,
        messages=[{"role": "user", "content": "now"}],
        extra_body={"ignore_eos": True},
    )
    assert answer.choices[0].message.content is not None
    assert "batch_line_preempted" in gateway.log.getvalue()

    def ended() -> object:
        current = client.batches.retrieve(batch.id)
        return current if current.status == "completed" else None

    done = wait_until(ended, 120, "the batch to complete")
    assert done.request_counts.completed == LINES  # type: ignore[union-attr]
    output = jsonl(client.files.content(done.output_file_id).text)  # type: ignore[attr-defined]
    assert sorted(line["custom_id"] for line in output) == sorted(f"long-{n}" for n in range(LINES))
    assert all(line["response"]["body"]["usage"]["completion_tokens"] == 300 for line in output)
