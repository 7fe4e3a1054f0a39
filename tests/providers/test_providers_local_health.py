"""The local engine's health through the gateway: /readyz, /metrics, routing around a dead
engine. Issue 10: a tensor-parallel rank that dies fails the requests in flight within seconds
(an SSE error event, a 5xx naming the engine), marks the local model unhealthy, and the next
requests are served by the upstream fallback with the route header saying why. Never a hang."""

from __future__ import annotations

import os
import signal
import time

import httpx
import orjson
from in_flight import InFlight
from local_policy import local_policy
from polling import wait_for

MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


def admin_health(gateway) -> dict:
    """``GET /admin/health``: the readiness checks with their details (admin key)."""
    reply = httpx.get(
        gateway.base_url + "/admin/health",
        headers={"Authorization": f"Bearer {gateway.app.state.secrets.admin_key}"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def engine_healthy_gauge(gateway) -> float:
    text = httpx.get(gateway.base_url + "/metrics", timeout=10).text
    line = next(row for row in text.splitlines() if row.startswith("engine_healthy "))
    return float(line.split()[1])


def test_killed_rank_fails_in_flight_requests_then_upstream_serves(
    start_gateway, checkpoint, upstream
):
    gateway, key = start_gateway(
        local_policy(
            checkpoint,
            upstream.base_url,
            tensor_parallel_size=2,
            max_num_seqs=4,
            max_num_batched_tokens=256,
            kv_cache_bytes=16 * 1024 * 1024,
        )
    )
    ready = httpx.get(gateway.base_url + "/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["checks"]["local_engine"] == "ready"
    assert engine_healthy_gauge(gateway) == 1.0
    engine = gateway.services.local_engine.engine
    pids = engine.engine.runner.worker_pids
    assert len(pids) == 2

    url = gateway.v1 + "/chat/completions"
    long = {"messages": MESSAGES, "max_tokens": 20000, "ignore_eos": True}
    stream = InFlight(url, key, {**long, "model": "auto", "stream": True}, task="mixed")
    # Pinned to the local model: no fallback, so the engine's own error comes back.
    pinned = InFlight(url, key, {**long, "model": "tiny"})
    assert stream.first_chunk.wait(20)
    wait_for(lambda: engine.load()["num_requests_running"] == 2, timeout_s=20)

    os.kill(pids[1], signal.SIGKILL)
    killed_at = time.monotonic()
    stream.thread.join(15)
    pinned.thread.join(15)
    assert not stream.thread.is_alive() and not pinned.thread.is_alive(), "a request hung"
    assert stream.ended_at - killed_at < 10 and pinned.ended_at - killed_at < 10

    assert stream.status == 200 and "event: error" in stream.text and "[DONE]" not in stream.text
    error_line = stream.text.split("event: error\n", 1)[1].splitlines()[0]
    error = orjson.loads(error_line.removeprefix("data: "))["error"]
    assert "local engine" in error["message"] and "rank 1" in error["message"], error
    assert pinned.status == 503, pinned.text
    message = orjson.loads(pinned.text)["error"]["message"]
    assert "local engine" in message and "killed by signal 9" in message, message

    # Routing now avoids the dead engine: the upstream fallback serves, and says why.
    for stream_it in (False, True):
        reply = httpx.post(
            url,
            json={"model": "auto", "messages": MESSAGES, "max_tokens": 4, "stream": stream_it},
            headers={"Authorization": f"Bearer {key}", "X-Task-Type": "mixed"},
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-switchyard-provider"] == "up"
        route = reply.headers["x-switchyard-route"]
        assert "skipped tiny: local engine is unhealthy: tensor-parallel rank 1" in route, route
    refused = httpx.post(
        url,
        json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert refused.status_code == 503 and "unhealthy" in refused.json()["error"]["message"]

    ready = httpx.get(gateway.base_url + "/readyz", timeout=10)
    assert ready.status_code == 200, ready.text  # the upstream still serves
    assert ready.json()["checks"]["local_engine"] == "unhealthy"  # states only, no details
    detail = admin_health(gateway)["details"]["local_engine"]
    assert detail.startswith("unhealthy: tensor-parallel rank 1") and "signal 9" in detail
    assert engine_healthy_gauge(gateway) == 0.0
    assert '"event":"local_engine_unhealthy"' in gateway.log.getvalue().replace(" ", "")


def test_failed_load_is_reported_and_unready_only_without_an_upstream(
    start_gateway, tmp_path, upstream
):
    missing = tmp_path / "no-such-checkpoint"
    alone, _ = start_gateway(local_policy(missing))
    ready = httpx.get(alone.base_url + "/readyz", timeout=10)
    assert ready.status_code == 503, ready.text  # nothing else could answer
    assert ready.json()["checks"]["local_engine"] == "failed"
    assert str(missing) not in ready.text  # the load error is for the admin only
    health = admin_health(alone)
    assert health["status"] == "not ready"
    assert health["details"]["local_engine"].startswith("failed: ")
    assert str(missing) in health["details"]["local_engine"]
    assert engine_healthy_gauge(alone) == 0.0

    with_upstream, key = start_gateway(local_policy(missing, upstream.base_url))
    ready = httpx.get(with_upstream.base_url + "/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["local_engine"] == "failed"
    reply = httpx.post(
        with_upstream.v1 + "/chat/completions",
        json={"model": "tiny", "messages": MESSAGES},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert reply.status_code == 503 and "failed to load" in reply.json()["error"]["message"]
