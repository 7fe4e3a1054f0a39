"""Issue 3 end to end: three gateway processes on one Redis share limits exactly, and a Redis
outage is handled by SWITCHYARD_LIMITS_ON_REDIS_FAILURE (closed → 503, open → served)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_runner import ADMIN_KEY, PEPPER

from gateway.store.embedded import EmbeddedRedis, free_port

pytestmark = pytest.mark.slow

# 24 characters: the gateway's prompt estimate is then exactly the fake upstream's 10 tokens,
# so the reservation (10 + max_tokens 5) equals what is settled and counts are exact.
MESSAGES = [{"role": "user", "content": "x" * 24}]
TOKENS_PER_REQUEST = 15
COST_PER_REQUEST = 0.02  # fake-model: 10 × $1000/M + 5 × $2000/M


class GatewayProcess:
    def __init__(self, redis_url: str, data_dir: Path, policy_file: Path, mode: str) -> None:
        self.port = free_port()
        self.log_path = data_dir / f"gateway-{self.port}.log"
        env = {
            **os.environ,
            "SWITCHYARD_PORT": str(self.port),
            "SWITCHYARD_REDIS_URL": redis_url,
            "SWITCHYARD_DATA_DIR": str(data_dir),
            "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
            "SWITCHYARD_KEY_PEPPER": PEPPER,
            "SWITCHYARD_POLICY_FILE": str(policy_file),
            "SWITCHYARD_LIMITS_ON_REDIS_FAILURE": mode,
            "SWITCHYARD_UPSTREAM_MAX_TRIES": "1",
            "SWITCHYARD_ACCESS_LOG": "false",
        }
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.log_path.read_text())
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("gateway did not start: " + self.log_path.read_text())

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_gateways(count: int, redis_url: str, data_dir: Path, policy: Path, mode: str):
    gateways = [GatewayProcess(redis_url, data_dir, policy, mode) for _ in range(count)]
    for gateway in gateways:
        gateway.wait_ready()
    return gateways


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, policy_file: Path, redis_url: str
) -> Iterator[list[GatewayProcess]]:
    gateways = start_gateways(
        3, redis_url, tmp_path_factory.mktemp("replicas"), policy_file, "closed"
    )
    try:
        yield gateways
    finally:
        for gateway in gateways:
            gateway.stop()


def create_key(base_url: str, **fields: object) -> str:
    response = httpx.post(
        base_url + "/admin/keys", json=fields, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert response.status_code == 201, response.text
    return response.json()["key"]


async def fire(urls: list[str], key: str, total: int) -> list[httpx.Response]:
    """``total`` concurrent chat requests spread round-robin over the gateways."""
    limits = httpx.Limits(max_connections=total, max_keepalive_connections=total)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        body = {"model": "fake-model", "messages": MESSAGES, "max_tokens": 5}
        headers = {"Authorization": f"Bearer {key}"}
        return await asyncio.gather(
            *(
                client.post(
                    urls[i % len(urls)] + "/v1/chat/completions", json=body, headers=headers
                )
                for i in range(total)
            )
        )


def outcomes(responses: list[httpx.Response]) -> Counter:
    counted: Counter = Counter()
    for response in responses:
        if response.status_code == 429:
            counted[f"429 {response.json()['error']['type']}"] += 1
        else:
            counted[str(response.status_code)] += 1
    return counted


async def test_rpm_is_exact_across_three_replicas(replicas: list[GatewayProcess]) -> None:
    key = create_key(replicas[0].url, name="rpm", rpm=100)
    responses = await fire([g.url for g in replicas], key, 300)
    assert outcomes(responses) == {"200": 100, "429 rate_limit_exceeded": 200}
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "100"
    served = next(r for r in responses if r.status_code == 200)
    assert served.headers["x-ratelimit-limit-requests"] == "100"


async def test_tpm_is_exact_across_three_replicas(replicas: list[GatewayProcess]) -> None:
    key = create_key(replicas[0].url, name="tpm", tpm=100 * TOKENS_PER_REQUEST)
    responses = await fire([g.url for g in replicas], key, 300)
    assert outcomes(responses) == {"200": 100, "429 rate_limit_exceeded": 200}
    assert "x-ratelimit-remaining-tokens" in responses[0].headers


async def test_budget_stops_at_the_budget(replicas: list[GatewayProcess]) -> None:
    key = create_key(
        replicas[0].url, name="budget", budget_usd=50 * COST_PER_REQUEST, budget_period="day"
    )
    responses = await fire([g.url for g in replicas], key, 80)
    assert outcomes(responses) == {"200": 50, "429 insufficient_quota": 30}


def _chat(url: str, key: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": MESSAGES, "max_tokens": 5},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def _until(url: str, key: str, status: int, timeout: float = 10) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        response = _chat(url, key)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_redis_outage_then_recovery(
    mode: str, own_redis: EmbeddedRedis, tmp_path: Path, policy_file: Path
) -> None:
    (gateway,) = start_gateways(1, own_redis.url, tmp_path, policy_file, mode)
    try:
        key = create_key(gateway.url, name=f"outage-{mode}", rpm=1000)
        assert _chat(gateway.url, key).status_code == 200
        time.sleep(1.1)  # appendfsync everysec: the key is on disk before the crash
        own_redis.kill()
        if mode == "closed":
            down = _until(gateway.url, key, 503)
            assert down.status_code == 503
            assert down.json()["error"]["type"] == "service_unavailable"
        else:
            for _ in range(5):
                served = _chat(gateway.url, key)
                assert served.status_code == 200, served.text
                assert "x-ratelimit-limit-requests" not in served.headers  # served unlimited
            metrics = httpx.get(gateway.url + "/metrics").text
            assert "switchyard_limits_fail_open_total 5.0" in metrics
        assert httpx.get(gateway.url + "/readyz").status_code == 503
        own_redis.start()
        recovered = _until(gateway.url, key, 200)
        assert recovered.status_code == 200
        assert recovered.headers["x-ratelimit-limit-requests"] == "1000"
    finally:
        gateway.stop()
