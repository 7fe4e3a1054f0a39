"""With no SWITCHYARD_REDIS_URL the app runs its own Redis: keys survive restarts and crashes."""

from __future__ import annotations

import time

import httpx
from gateway_runner import GatewayThread, RunningGateway, make_settings

HI = [{"role": "user", "content": "hi"}]


def _chat(gateway: RunningGateway, key: str) -> httpx.Response:
    return httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": "fake", "messages": HI},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_keys_survive_an_app_restart(tmp_path, fake_policy) -> None:
    settings = make_settings(tmp_path, fake_policy, redis_url="")
    first = GatewayThread(settings)
    running = first.start()
    try:
        assert running.services.embedded_redis is not None
        _, key = running.create_key(name="persistent", rpm=100)
        assert _chat(running, key).status_code == 200
    finally:
        first.stop()
    assert (tmp_path / "redis").is_dir()
    second = GatewayThread(settings)
    running = second.start()
    try:
        assert _chat(running, key).status_code == 200
    finally:
        second.stop()


def test_supervisor_restarts_a_crashed_redis(tmp_path, fake_policy) -> None:
    settings = make_settings(tmp_path, fake_policy, redis_url="", redis_supervise_interval_s=0.2)
    runner = GatewayThread(settings)
    running = runner.start()
    try:
        _, key = running.create_key(name="survivor", rpm=100)
        time.sleep(1.1)  # let appendfsync everysec reach the disk
        server = running.services.embedded_redis
        server.process.kill()
        server.process.wait()
        deadline = time.monotonic() + 10
        while True:
            response = _chat(running, key)
            if response.status_code == 200:
                break
            assert response.status_code == 503, response.text
            assert time.monotonic() < deadline, "embedded Redis was not restarted"
            time.sleep(0.1)
        metrics = httpx.get(running.base_url + "/metrics").text
        assert "switchyard_embedded_redis_restarts_total 1.0" in metrics
    finally:
        runner.stop()
