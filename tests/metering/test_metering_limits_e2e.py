"""Issue 3 end to end: three gateway processes on one Redis share limits exactly, and a Redis
outage is handled by SWITCHYARD_LIMITS_ON_REDIS_FAILURE (closed → 503, open → served)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from gateway_runner import GatewayProcess
from replica_load import (
    COST_PER_REQUEST,
    TOKENS_PER_REQUEST,
    chat,
    chat_until,
    fire,
    new_key,
    outcomes,
    replicas_on,
)

from gateway.store.embedded import EmbeddedRedis

pytestmark = pytest.mark.slow


async def test_rpm_is_exact_across_three_replicas(replicas: list[GatewayProcess]) -> None:
    key = new_key(replicas[0], name="rpm", rpm=100)
    responses = await fire([g.url for g in replicas], key, 300)
    assert outcomes(responses) == {"200": 100, "429 rate_limit_exceeded": 200}
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "100"
    served = next(r for r in responses if r.status_code == 200)
    assert served.headers["x-ratelimit-limit-requests"] == "100"


async def test_tpm_is_exact_across_three_replicas(replicas: list[GatewayProcess]) -> None:
    key = new_key(replicas[0], name="tpm", tpm=100 * TOKENS_PER_REQUEST)
    responses = await fire([g.url for g in replicas], key, 300)
    assert outcomes(responses) == {"200": 100, "429 rate_limit_exceeded": 200}
    assert "x-ratelimit-remaining-tokens" in responses[0].headers


async def test_budget_stops_at_the_budget(replicas: list[GatewayProcess]) -> None:
    key = new_key(replicas[0], name="budget", budget_usd=50 * COST_PER_REQUEST, budget_period="day")
    responses = await fire([g.url for g in replicas], key, 80)
    assert outcomes(responses) == {"200": 50, "429 insufficient_quota": 30}


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_redis_outage_then_recovery(
    mode: str, own_redis: EmbeddedRedis, tmp_path: Path, fake_policy: Path
) -> None:
    with replicas_on(own_redis.url, 1, tmp_path, fake_policy, on_redis_failure=mode) as (gateway,):
        key = new_key(gateway, name=f"outage-{mode}", rpm=1000)
        assert chat(gateway.url, key).status_code == 200
        time.sleep(1.1)  # appendfsync everysec: the key is on disk before the crash
        own_redis.kill()
        if mode == "closed":
            down = chat_until(gateway.url, key, 503)
            assert down.status_code == 503
            assert down.json()["error"]["type"] == "service_unavailable"
        else:
            for _ in range(5):
                served = chat(gateway.url, key)
                assert served.status_code == 200, served.text
                assert "x-ratelimit-limit-requests" not in served.headers  # served unlimited
            metrics = httpx.get(gateway.url + "/metrics").text
            assert "switchyard_limits_fail_open_total 5.0" in metrics
        assert httpx.get(gateway.url + "/readyz").status_code == 503
        own_redis.start()
        recovered = chat_until(gateway.url, key, 200)
        assert recovered.status_code == 200
        assert recovered.headers["x-ratelimit-limit-requests"] == "1000"
