"""Batching, disconnects and load-aware spill-over of the local engine behind the gateway."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import httpx
import orjson
from openai import AsyncOpenAI, OpenAI

MESSAGES = [{"role": "user", "content": "Tell me about the weather."}]


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def idle(engine) -> bool:
    load = engine.load()
    return load["num_requests_running"] == 0 and load["num_requests_waiting"] == 0


def busy(engine) -> bool:
    load = engine.load()
    return load["num_requests_running"] == 2 and load["num_requests_waiting"] >= 1


def test_concurrent_requests_share_engine_steps(local_gateway, api_key):
    engine = local_gateway.engine
    wait_for(lambda: idle(engine))
    steps_before = engine.stats()["num_steps"]

    async def burst() -> list[str]:
        client = AsyncOpenAI(base_url=local_gateway.v1, api_key=api_key, max_retries=0)
        async with client:
            replies = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model="tiny",
                        messages=MESSAGES,
                        max_tokens=24,
                        temperature=0,
                        extra_body={"ignore_eos": True},
                    )
                    for _ in range(4)
                )
            )
        return [r.id for r in replies]

    ids = asyncio.run(burst())
    assert len(set(ids)) == 4
    steps = engine.engine.stats.step_history()[steps_before - engine.stats()["num_steps"] :]
    widest = max(len(set(step.request_ids)) for step in steps)
    assert widest >= 2, "no step computed two requests together"


class HeldStream:
    """A streaming request on its own thread that reads slowly until told to disconnect."""

    def __init__(self, base_url: str, api_key: str, max_tokens: int = 20000) -> None:
        self.body = {
            "model": "tiny",
            "messages": MESSAGES,
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
        self.url = base_url + "/chat/completions"
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.first_chunk = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", self.url, json=self.body, headers=self.headers) as reply,
        ):
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    self.first_chunk.set()
                if self.stop.is_set():
                    return  # closes the connection mid-stream

    def disconnect(self) -> None:
        self.stop.set()
        self.thread.join(30)


def test_disconnected_stream_frees_its_blocks(local_gateway, api_key):
    engine = local_gateway.engine
    wait_for(lambda: idle(engine))
    held = HeldStream(local_gateway.v1, api_key)
    assert held.first_chunk.wait(30)
    wait_for(lambda: engine.load()["num_requests_running"] == 1)
    assert engine.load()["kv_cache_usage_perc"] > 0
    held.disconnect()
    wait_for(lambda: idle(engine) and engine.load()["kv_cache_usage_perc"] == 0.0)
    assert engine.engine.block_manager.num_used_blocks == 0


def test_disconnected_non_stream_request_aborts_and_frees_its_blocks(local_gateway, api_key):
    engine = local_gateway.engine
    wait_for(lambda: idle(engine))
    generated_before = engine.stats()["generation_tokens_total"]
    body = orjson.dumps(
        {"model": "tiny", "messages": MESSAGES, "max_tokens": 20000, "ignore_eos": True}
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", local_gateway.port), timeout=30) as sock:
        sock.sendall(head + body)
        wait_for(lambda: engine.load()["num_requests_running"] == 1)
        assert engine.load()["kv_cache_usage_perc"] > 0
    # The socket is closed: the handler sees http.disconnect and the engine aborts.
    wait_for(lambda: idle(engine) and engine.load()["kv_cache_usage_perc"] == 0.0, timeout=10)
    assert engine.engine.block_manager.num_used_blocks == 0
    generated = engine.stats()["generation_tokens_total"] - generated_before
    assert 0 < generated < 20000, "the sequence ran on after its client left"
    wait_for(lambda: '"status":499' in local_gateway.log.getvalue().replace(" ", ""), timeout=10)


def test_spill_over_while_the_queue_is_held_then_back(local_gateway, api_key, upstream):
    engine = local_gateway.engine
    wait_for(lambda: idle(engine))
    client = OpenAI(base_url=local_gateway.v1, api_key=api_key, max_retries=0, timeout=60)
    # max_num_seqs is 2: two streams run, the third waits -> past spill_when {waiting: 0}.
    holders = [HeldStream(local_gateway.v1, api_key) for _ in range(3)]
    try:
        wait_for(lambda: busy(engine))
        for _ in range(2):
            before = engine.load()
            raw = client.chat.completions.with_raw_response.create(
                model="auto",
                messages=MESSAGES,
                max_tokens=4,
                extra_headers={"X-Task-Type": "mixed"},
            )
            assert raw.headers["x-switchyard-provider"] == "up", (before, dict(raw.headers))
            assert raw.headers["x-switchyard-route"].endswith("; spilled")
            assert raw.parse().choices[0].message.content == "Hello from the fake upstream."
        assert busy(engine)  # the queue was held past its threshold all along
    finally:
        for holder in holders:
            holder.disconnect()
    wait_for(lambda: idle(engine))
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, max_tokens=4, extra_headers={"X-Task-Type": "mixed"}
    )
    assert raw.headers["x-switchyard-provider"] == "home"
    assert "spilled" not in raw.headers["x-switchyard-route"]
    explain = httpx.post(
        local_gateway.base_url + "/admin/route/explain",
        json={"body": {"messages": MESSAGES}, "headers": {"x-task-type": "mixed"}},
        headers={"Authorization": "Bearer sy-admin-local-0123456789abcdef"},
        timeout=10,
    )
    assert explain.status_code == 200, explain.text
