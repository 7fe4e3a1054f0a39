"""Batching, disconnects and load-aware spill-over of the local engine behind the gateway."""

from __future__ import annotations

import asyncio
import socket

import httpx
import orjson
from in_flight import held_stream
from openai import AsyncOpenAI, OpenAI
from polling import wait_for

MESSAGES = [{"role": "user", "content": "Tell me about the weather."}]


def idle(engine) -> bool:
    load = engine.load()
    return load["num_requests_running"] == 0 and load["num_requests_waiting"] == 0


def busy(engine) -> bool:
    load = engine.load()
    return load["num_requests_running"] == 2 and load["num_requests_waiting"] >= 1


def test_concurrent_requests_share_engine_steps(local_gateway, api_key):
    engine = local_gateway.services.local_engine.engine
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


def test_disconnected_stream_frees_its_blocks(local_gateway, api_key):
    engine = local_gateway.services.local_engine.engine
    wait_for(lambda: idle(engine))
    held = held_stream(local_gateway.v1, api_key, MESSAGES)
    assert held.first_chunk.wait(30)
    wait_for(lambda: engine.load()["num_requests_running"] == 1)
    assert engine.load()["kv_cache_usage_perc"] > 0
    held.disconnect()
    wait_for(lambda: idle(engine) and engine.load()["kv_cache_usage_perc"] == 0.0)
    assert engine.engine.block_manager.num_used_blocks == 0


def test_disconnected_non_stream_request_aborts_and_frees_its_blocks(local_gateway, api_key):
    engine = local_gateway.services.local_engine.engine
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
    wait_for(lambda: idle(engine) and engine.load()["kv_cache_usage_perc"] == 0.0, timeout_s=10)
    assert engine.engine.block_manager.num_used_blocks == 0
    generated = engine.stats()["generation_tokens_total"] - generated_before
    assert 0 < generated < 20000, "the sequence ran on after its client left"
    wait_for(lambda: '"status":499' in local_gateway.log.getvalue().replace(" ", ""), timeout_s=10)


def test_spill_over_while_the_queue_is_held_then_back(local_gateway, api_key, upstream):
    engine = local_gateway.services.local_engine.engine
    wait_for(lambda: idle(engine))
    client = OpenAI(base_url=local_gateway.v1, api_key=api_key, max_retries=0, timeout=60)
    # max_num_seqs is 2: two streams run, the third waits -> past spill_when {waiting: 0}.
    holders = [held_stream(local_gateway.v1, api_key, MESSAGES) for _ in range(3)]
    try:
        wait_for(lambda: busy(engine))
        for _ in range(2):
            before = engine.load()
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="auto",
                    messages=MESSAGES,
                    max_tokens=4,
                    extra_headers={"X-Task-Type": "mixed"},
                )
            except Exception as error:  # what the gateway did with it is in its log
                tail = "\n".join(local_gateway.log.getvalue().splitlines()[-40:])
                raise AssertionError(
                    f"load before: {before}, now: {engine.load()}\n{tail}"
                ) from error
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
        headers={"Authorization": f"Bearer {local_gateway.admin_key}"},
        timeout=10,
    )
    assert explain.status_code == 200, explain.text
