"""SIGTERM drains the gateway: readiness goes false, new requests (also on kept-alive
connections) get a 503 envelope, streams in flight finish, every usage event reaches Redis, and
the embedded Redis stops cleanly (its data intact on the next start)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
import redis.asyncio
from fake_upstream import FakeUpstream, ThreadedFakeUpstream
from marked_gateway import MarkedGateway, write_policy

from gateway.ledger import open_store
from gateway.metering.buffer import UsageBuffer
from gateway.metering.reports import UsageReports
from gateway.store.embedded import EmbeddedRedis

HI = [{"role": "user", "content": "hi"}]
STREAMS = 3


@pytest.fixture(scope="module")
def slow_upstream() -> Iterator[FakeUpstream]:
    # drip: five chunks 0.5 s apart, so a stream is in flight for about 2.5 s.
    with ThreadedFakeUpstream(drip_s=0.5) as upstream:
        yield upstream


def _stream(base_url: str, key: str, results: list[str], first_chunk: threading.Event) -> None:
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)
    text = ""
    for chunk in client.chat.completions.create(
        model="drip-model",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=4,
        stream=True,
    ):
        first_chunk.set()
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    results.append(text)


async def _requests_recorded(url: str, data_dir: Path, key_id: str) -> tuple[int, int | None]:
    """The key's requests in the gateway's usage store, and the events still in its buffer."""
    client = redis.asyncio.Redis.from_url(url)
    store = await open_store("", data_dir=data_dir)
    try:
        buffer = UsageBuffer(client)
        buffer.bind(store.store_id)
        usage = await UsageReports(store, buffer).usage_for_key(key_id, 1)
        return usage["requests"], usage["pending_export"]
    finally:
        await store.close()
        await client.aclose()


def test_sigterm_drains_streams_refuses_new_requests_and_keeps_usage(
    tmp_path: Path, slow_upstream: FakeUpstream
) -> None:
    data_dir = tmp_path / "gw"
    data_dir.mkdir()
    gateway = MarkedGateway(
        data_dir, write_policy(tmp_path, slow_upstream.base_url), shutdown_grace_s=20
    ).start()
    try:
        key_id, key = gateway.create_key(name="drain")
        auth = {"Authorization": f"Bearer {key}"}
        kept_alive = httpx.Client(base_url=gateway.base_url, headers=auth, timeout=10)
        before = kept_alive.post(
            "/v1/chat/completions", json={"model": "fake", "messages": HI, "max_tokens": 2}
        )
        assert before.status_code == 200

        results: list[str] = []
        started = [threading.Event() for _ in range(STREAMS)]
        threads = [
            threading.Thread(target=_stream, args=(gateway.v1, key, results, event))
            for event in started
        ]
        for thread in threads:
            thread.start()
        for event in started:
            assert event.wait(10), gateway.output()

        gateway.terminate()
        time.sleep(0.3)  # the signal is handled between loop turns

        ready = httpx.get(gateway.base_url + "/readyz", timeout=5)
        assert ready.status_code == 503
        assert ready.json()["checks"]["shutdown"] == "draining"
        for client in (kept_alive, httpx.Client(base_url=gateway.base_url, headers=auth)):
            refused = client.post("/v1/chat/completions", json={"model": "fake", "messages": HI})
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "shutting_down"
            assert refused.headers["connection"] == "close"
            client.close()

        for thread in threads:
            thread.join(20)
        assert results == ["Hello from the fake upstream."] * STREAMS
        gateway.wait(20)
    finally:
        gateway.stop()

    output = gateway.output()
    assert "shutdown_draining" in output and "shutdown_drained" in output, output
    assert "embedded_redis_stopped" in output, output
    assert "Traceback" not in output, output

    # The embedded Redis is gone (its socket answers nothing) and restarts with every record.
    server = EmbeddedRedis(data_dir / "redis")
    with pytest.raises((redis.ConnectionError, FileNotFoundError, OSError)):
        redis.Redis(unix_socket_path=str(server.socket_path), socket_timeout=1).ping()
    url = server.start()
    try:
        # The last exporter round at shutdown moved them all into the store.
        assert asyncio.run(_requests_recorded(url, data_dir, key_id)) == (1 + STREAMS, 0)
    finally:
        server.stop()
