"""A gateway of this version started on the Redis data of the previous ones: a budget hash in
micro-dollars, a hold still in flight and one whose lease lapsed, usage kept in Redis (per-key
event streams with micro- and nano-dollar events, their day aggregates, idempotency markers and
index sets) and a spooled micro-dollar event. The usage moves into the SQL store (reported
exactly, x1000 where it was micro-dollars), Redis is emptied of every old usage key, and the
budget is reserved against, settled and reported exactly."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import orjson
import redis
import redis.asyncio
from counting_provider import CountingProvider
from gateway_runner import GatewayProcess
from usage_workload import metered_gateway, wait_for_events

from gateway.metering.limits import KeyLimits, Limiter, Reservation
from gateway.metering.spool import Spool

MESSAGES = [{"role": "user", "content": " ".join(["ab"] * 12)}]  # 12 tokens
PER_REQUEST_NANOS = 12 * 150 + 9 * 600  # m-exact: $0.15 and $0.60 per 1M tokens
# Each is held at its bound (130 prompt tokens, docs/limits.md) + 9 until it settles.
HOLD_NANOS = 130 * 150 + 9 * 600
LEGACY_SPOOL_KEY = "legacyspool00000"


def _legacy_event(
    key_id: str, request_id: str, cost: int, *, unit: str = "micros", age_s: float = 60
) -> dict[str, Any]:
    """A usage event as an older version wrote it (stream entry or spool line): the cost in
    micro-dollars (``cost_micros``, with its ``cost_usd``), or already in nano-dollars."""
    event: dict[str, Any] = {
        "time": time.time() - age_s,
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
        "policy_version": "old",
        "latency_ms": 5,
        "ttft_ms": None,
        "status": 200,
        "streamed": False,
        "usage_source": "provider",
        "attempts": 1,
    }
    if unit == "micros":
        event.update(cost_usd=cost / 1e6, cost_micros=cost)
    else:
        event.update(cost_usd=cost / 1e9, cost_nanos=cost)
    return event


def _old_group(model: str, provider: str) -> str:
    """The old day hashes' field prefix: ``m:<model>|p:<provider>|t:<task>|team:<team>``."""
    return f"m:{quote(model, safe='')}|p:{quote(provider, safe='')}|t:|team:"


def _day(event: dict[str, Any]) -> str:
    return datetime.fromtimestamp(event["time"], UTC).strftime("%Y%m%d")


def _write_legacy_usage(client: redis.Redis, events: list[dict[str, Any]]) -> None:
    """What the old record script and its index writes left for each event."""
    for event in events:
        base = f"sy:{{key:{event['key_id']}}}:usage"
        day = _day(event)
        client.xadd(base + ":events", {"e": orjson.dumps(event)})
        client.set(f"{base}:seen:{event['request_id']}", "1", ex=401 * 86_400)
        group = _old_group(event["model"], event["provider"])
        metric, cost = ("cost", event["cost_micros"]) if "cost_micros" in event else (
            "nano", event["cost_nanos"])  # fmt: skip
        for name, value in (("req", 1), ("prompt", 12), ("completion", 20), (metric, cost)):
            client.hincrby(f"{base}:day:{day}", f"{group}:{name}", value)
        client.sadd("sy:usage:keys", event["key_id"])
        client.sadd(f"sy:usage:active:{day}", event["key_id"])


OLD_PATTERNS = ("sy:{key:*}:usage:*", "sy:usage:keys", "sy:usage:active:*")


def _old_usage_keys(client: redis.Redis) -> list[bytes]:
    return [name for pattern in OLD_PATTERNS for name in client.scan_iter(match=pattern)]


def _write_legacy_budget(client: redis.Redis, key_id: str) -> None:
    base = f"sy:{{key:{key_id}}}:"
    now_ms = int(time.time() * 1000)
    bucket = now_ms // 1000  # the limiter's 1 s sub-bucket
    # $0.0005 spent; two $0.000007 holds: one in flight, one whose holder died an hour ago.
    client.hset(base + "budget:total", mapping={"window": "total", "spent": 500, "reserved": 14})
    client.hset(base + "held", "old-inflight", f"21 7 {bucket} total total")
    client.hset(base + "held", "old-lapsed", f"21 7 {bucket - 3600} total total")
    client.zadd(base + "leases", {"old-inflight": now_ms + 3_600_000, "old-lapsed": now_ms - 1})


async def _send(gateway: GatewayProcess, key: str, count: int) -> list[int]:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    gate = asyncio.Semaphore(1)  # one at a time: each settles before the next reserves

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


async def test_old_redis_usage_moves_to_the_store_and_budgets_keep_working(
    clean_redis: str, provider: CountingProvider, counting_policy: Path, tmp_path: Path
) -> None:
    gateway = metered_gateway(clean_redis, tmp_path / "gw", counting_policy).start()
    key_id, key = gateway.create_key(name="old", budget_usd=0.001, budget_period="total")
    gateway.stop()  # the old version's data is written with no gateway running
    client = redis.Redis.from_url(clean_redis)
    async_client = redis.asyncio.Redis.from_url(clean_redis)
    old_events = [
        # 1,692 µ$ and 7 µ$ (micro-dollars), 3,200 and 1 nano-dollars; one a day old.
        _legacy_event(key_id, "old-micro-1", 1_692),
        _legacy_event(key_id, "old-micro-2", 7, age_s=86_400 + 60),
        _legacy_event(key_id, "old-nano-1", 3_200, unit="nanos"),
        _legacy_event(key_id, "old-nano-2", 1, unit="nanos"),
        # A key deleted since: its usage stays reported.
        _legacy_event("gonekey000000001", "old-gone", 40, unit="nanos"),
    ]
    old_nanos = 1_692_000 + 7_000 + 3_200 + 1
    try:
        _write_legacy_usage(client, old_events)
        _write_legacy_budget(client, key_id)
        # An event the old version spooled while Redis was away: replayed by the new one.
        spooled = orjson.dumps(_legacy_event(LEGACY_SPOOL_KEY, "spooled", 14))
        Spool(gateway.data_dir / "spool").append_sync(spooled)
        days = {(e["key_id"], _day(e)) for e in old_events}
        # One marker per event, a stream per key, a hash per key and day, the index sets.
        assert len(_old_usage_keys(client)) == 5 + 2 + len(days) + 1 + len({d for _, d in days})

        gateway.start()
        with gateway.admin() as admin:
            events = wait_for_events(admin, len(old_events) + 1)
        for name in ("old-micro-1", "old-micro-2", "old-nano-1", "old-nano-2", "old-gone"):
            assert "cost_micros" not in events[name]
        assert events["old-micro-1"]["cost_nanos"] == 1_692_000  # x1000, exactly
        assert events["old-micro-1"]["cost_usd"] == 0.001692
        assert events["old-micro-2"]["cost_nanos"] == 7_000
        assert events["old-nano-1"]["cost_nanos"] == 3_200
        assert events["spooled"]["cost_nanos"] == 14_000  # replayed from the old spool line
        # Once exported, every old usage key is gone: streams, aggregates, markers, indexes.
        deadline = time.monotonic() + 20
        while _old_usage_keys(client) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert _old_usage_keys(client) == []
        assert "usage_legacy_imported" in gateway.output()

        # Left: $0.001 - $0.0005 spent - $0.000007 still held (the lapsed hold is reclaimed by
        # the first reserve) = 493,000 nano-dollars: requests of 7,200 are admitted while the
        # spend so far and one hold of 24,900 fit, 66 of them.
        fits = 1 + (493_000 - HOLD_NANOS) // PER_REQUEST_NANOS
        assert fits == 66
        statuses = await _send(gateway, key, 100)
        assert statuses.count(200) == fits and statuses.count(429) == 100 - fits
        assert len(provider.snapshot()) == fits

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
        assert status["budget"]["spent_nanos"] == 500_000 + (fits + 1) * PER_REQUEST_NANOS + 3_200
        assert status["budget"]["remaining_nanos"] == 14_400
        assert status["in_flight"] == 0

        gateway.wait_exported()
        usage = httpx.get(
            gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {key}"}
        ).json()
        assert usage["total_cost_nanos"] == old_nanos + fits * PER_REQUEST_NANOS
        assert usage["requests"] == 4 + 100  # the 34 refused are recorded too, at no cost
        with gateway.admin() as admin:
            by_key = {
                row["key"]: row
                for row in admin.get("/admin/usage", params={"group_by": "key"}).json()["data"]
            }
        assert by_key[key_id]["cost_nanos"] == usage["total_cost_nanos"]
        assert by_key["gonekey000000001"]["cost_nanos"] == 40
        assert by_key[LEGACY_SPOOL_KEY]["cost_nanos"] == 14_000
        assert _old_usage_keys(client) == []
    finally:
        await async_client.aclose()
        client.close()
        gateway.stop()
