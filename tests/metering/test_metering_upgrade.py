"""Data written in micro-dollars before the nano-dollar upgrade keeps working: a budget hash, a
hold still in flight and one whose lease lapsed, a usage event, a day aggregate and a spooled
event, all in the old format in a real Redis (and spool), then reserved against, settled and
reported through a running gateway of the new version."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import orjson
import redis
import redis.asyncio
from counting_provider import CountingProvider
from gateway_runner import GatewayProcess
from usage_workload import metered_gateway, wait_for_events

from gateway.metering.ledger import group_field
from gateway.metering.limits import KeyLimits, Limiter, Reservation
from gateway.metering.spool import Spool

MESSAGES = [{"role": "user", "content": " ".join(["ab"] * 12)}]  # estimate = usage: 12 tokens
PER_REQUEST_NANOS = 12 * 150 + 9 * 600  # m-exact: $0.15 and $0.60 per 1M tokens
LEGACY_SPOOL_KEY = "legacyspool00000"


def _legacy_event(key_id: str, request_id: str, cost_micros: int) -> bytes:
    """A usage event as the micro-dollar version wrote it (stream entry or spool line)."""
    return orjson.dumps(
        {
            "time": time.time() - 60,
            "request_id": request_id,
            "key_id": key_id,
            "model": "m-exact",
            "provider": "b",
            "team": "",
            "task": "",
            "route": "chat.completions",
            "prompt_tokens": 12,
            "completion_tokens": 20,
            "cached_tokens": 0,
            "cost_usd": cost_micros / 1e6,
            "cost_micros": cost_micros,
            "policy_version": "old",
            "latency_ms": 5,
            "ttft_ms": None,
            "status": 200,
            "streamed": False,
            "usage_source": "provider",
            "attempts": 1,
        }
    )


def _write_legacy_state(client: redis.Redis, key_id: str) -> None:
    base = f"sy:{{key:{key_id}}}:"
    now_ms = int(time.time() * 1000)
    bucket = now_ms // 1000  # the limiter's 1 s sub-bucket
    # $0.0005 spent; two $0.000007 holds: one in flight, one whose holder died an hour ago.
    client.hset(base + "budget:total", mapping={"window": "total", "spent": 500, "reserved": 14})
    client.hset(base + "held", "old-inflight", f"21 7 {bucket} total total")
    client.hset(base + "held", "old-lapsed", f"21 7 {bucket - 3600} total total")
    client.zadd(base + "leases", {"old-inflight": now_ms + 3_600_000, "old-lapsed": now_ms - 1})
    # One old event and its day aggregate: 180 requests for 1,692 µ$.
    client.xadd(base + "usage:events", {"e": _legacy_event(key_id, "old-event", 1_692)})
    day = datetime.now(UTC).strftime("%Y%m%d")
    group = group_field("m-exact", "b", "", "")
    client.hset(
        base + f"usage:day:{day}",
        mapping={f"{group}:req": 180, f"{group}:prompt": 2_160, f"{group}:cost": 1_692},
    )
    client.sadd("sy:usage:keys", key_id)
    client.sadd(f"sy:usage:active:{day}", key_id)


async def _send(gateway: GatewayProcess, key: str, count: int) -> list[int]:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    gate = asyncio.Semaphore(16)

    async def one(index: int) -> int:
        async with gate:
            try:
                await client.chat.completions.create(
                    model="m-exact", messages=MESSAGES, max_tokens=9, user=f"up-{index}"
                )
                return 200
            except openai.APIStatusError as exc:
                return exc.status_code

    try:
        return await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await client.close()


async def test_old_micro_dollar_data_is_reserved_settled_and_reported_exactly(
    clean_redis: str, provider: CountingProvider, counting_policy: Path, tmp_path: Path
) -> None:
    gateway = metered_gateway(clean_redis, tmp_path / "gw", counting_policy)
    # An event the old version spooled while Redis was away: replayed by the new one.
    Spool(gateway.data_dir / "spool").append_sync(_legacy_event(LEGACY_SPOOL_KEY, "spooled", 14))
    gateway.start()
    client = redis.Redis.from_url(clean_redis)
    async_client = redis.asyncio.Redis.from_url(clean_redis)
    try:
        key_id, key = gateway.create_key(name="old", budget_usd=0.001, budget_period="total")
        _write_legacy_state(client, key_id)

        # Left: $0.001 - $0.0005 spent - $0.000007 still held (the lapsed hold is reclaimed by
        # the first reserve) = 493,000 nano-dollars: 68 requests of 7,200 fit, not 69.
        statuses = await _send(gateway, key, 100)
        assert statuses.count(200) == 68 and statuses.count(429) == 32
        assert len(provider.snapshot()) == 68

        budget_key = f"sy:{{key:{key_id}}}:budget:total"
        assert client.hget(budget_key, "unit") == b"nano"  # scaled once, in place
        assert client.hget(f"sy:{{key:{key_id}}}:held", "old-lapsed").endswith(b" r")
        # The new code settles the old hold (7 µ$ held, 7,200 nano-dollars used) and the late
        # settle of the reclaimed one charges what it spent without releasing it twice.
        limiter = Limiter(async_client)
        in_flight = Reservation(key_id, "old-inflight", 21, 7_000, 0.0, "total")
        lapsed = Reservation(key_id, "old-lapsed", 21, 7_000, 0.0, "total")
        assert await limiter.settle(in_flight, tokens=21, cost_nanos=PER_REQUEST_NANOS)
        assert await limiter.settle(lapsed, tokens=21, cost_nanos=3_200)
        status = await limiter.status(
            key_id, KeyLimits(budget_nanos=1_000_000, budget_period="total")
        )
        assert status["budget"]["reserved_nanos"] == 0
        assert status["budget"]["spent_nanos"] == 500_000 + 69 * PER_REQUEST_NANOS + 3_200
        assert status["budget"]["remaining_nanos"] == 0
        assert status["in_flight"] == 0

        usage = httpx.get(
            gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {key}"}
        ).json()
        assert usage["total_cost_nanos"] == 1_692_000 + 68 * PER_REQUEST_NANOS  # old x1000
        assert usage["requests"] == 180 + 100
        with gateway.admin() as admin:
            events = wait_for_events(admin, 100 + 1 + 1)
            assert events["old-event"]["cost_nanos"] == 1_692_000
            assert events["old-event"]["cost_usd"] == 0.001692
            assert "cost_micros" not in events["old-event"]
            assert events["spooled"]["cost_nanos"] == 14_000  # replayed from the old spool line
            by_key = {
                row["key"]: row
                for row in admin.get("/admin/usage", params={"group_by": "key"}).json()["data"]
            }
        assert by_key[key_id]["cost_nanos"] == usage["total_cost_nanos"]
        assert by_key[LEGACY_SPOOL_KEY]["cost_nanos"] == 14_000
    finally:
        await async_client.aclose()
        client.close()
        gateway.stop()
